//! A rate sweep: open-loop storms at rising rates, to find the fleet's capacity and its knee, as
//! guidellm's sweep does. Each step is one open-loop storm ([`run_storm_until`]) of
//! [`SweepConfig::storm`]'s shape at the step's rate; the sweep stops when goodput falls, when a
//! request ends otherwise than answered or shed with `Retry-After`, when the fleet has been
//! saturated for `saturated_steps` steps in a row, or at the last step.

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::arrivals::OpenLoop;
use super::config::StormConfig;
use super::run::run_storm_until;

/// A step is saturated when its goodput is below this share of the rate achieved: the fleet no
/// longer answers in time what it is sent.
pub const SATURATED_SHARE: f64 = 0.9;

/// A sweep stops once a step's goodput falls below this share of the best goodput so far.
pub const FALLING_SHARE: f64 = 0.9;

/// How the rate rises from one step to the next.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateStep {
    /// Add this many requests per second.
    Add(f64),
    /// Multiply by this factor (above 1).
    Multiply(f64),
}

/// What a sweep sends.
#[derive(Clone, Debug)]
pub struct SweepConfig {
    /// The storm of every step; its `open_loop` gives the arrival process and each step's
    /// duration (its rate is replaced by the step's), its `slo_ttft` the objective of goodput
    /// (required).
    pub storm: StormConfig,
    /// Rate of the first step, requests per second.
    pub start_rate: f64,
    /// How the rate rises.
    pub step: RateStep,
    /// Most steps.
    pub max_steps: usize,
    /// Steps in a row past the knee (saturated) after which the sweep stops. At least 1.
    pub saturated_steps: usize,
}

/// One step of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepStep {
    /// The rate asked, requests per second.
    pub rate_asked: f64,
    /// The rate achieved, requests per second.
    pub rate_achieved: f64,
    /// Answers within the TTFT objective per second.
    pub goodput_rps: f64,
    /// p99 TTFT of the answers, ms.
    pub ttft_p99_ms: f64,
    /// Answered 2xx.
    pub answered: u64,
    /// Shed with 503 and `Retry-After`.
    pub shed: u64,
    /// Neither answered nor shed cleanly.
    pub unclean: u64,
    /// Most requests in flight at once.
    pub peak_in_flight: usize,
    /// Goodput below [`SATURATED_SHARE`] of the rate achieved.
    pub saturated: bool,
}

/// What a sweep found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepReport {
    /// Every step run, in order.
    pub steps: Vec<SweepStep>,
    /// The capacity estimate: the best goodput of any step, requests per second.
    pub capacity_rps: f64,
    /// The knee: the highest rate asked whose step was not saturated; `None` when the first step
    /// already was.
    pub knee_rps: Option<f64>,
    /// Why the sweep stopped.
    pub stopped: String,
}

impl SweepConfig {
    /// The rate of step `index` (from 0).
    pub fn rate(&self, index: usize) -> f64 {
        match self.step {
            RateStep::Add(add) => self.start_rate + add * index as f64,
            RateStep::Multiply(factor) => self.start_rate * factor.powi(index as i32),
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.storm.slo_ttft.is_some(),
            "a sweep needs a TTFT objective (--slo-ttft-ms) to measure goodput"
        );
        anyhow::ensure!(
            self.start_rate.is_finite() && self.start_rate > 0.0,
            "the start rate must be a positive number"
        );
        match self.step {
            RateStep::Add(add) => anyhow::ensure!(
                add.is_finite() && add > 0.0,
                "the rate step must be a positive number"
            ),
            RateStep::Multiply(f) => {
                anyhow::ensure!(f.is_finite() && f > 1.0, "the rate factor must be above 1")
            }
        }
        anyhow::ensure!(self.max_steps > 0, "a sweep needs at least one step");
        anyhow::ensure!(
            self.saturated_steps > 0,
            "saturated steps must be at least 1"
        );
        Ok(())
    }
}

/// Runs the sweep, calling `on_step` after each step (progress output); stops early, with the
/// steps run so far, when `stop` fires.
///
/// # Errors
///
/// On a sweep without a TTFT objective, a start rate, step or factor that never rises, or when a
/// step's storm fails as [`run_storm_until`] does.
pub async fn run_sweep(
    config: &SweepConfig,
    stop: &CancellationToken,
    mut on_step: impl FnMut(&SweepStep),
) -> anyhow::Result<SweepReport> {
    config.check()?;
    let base = config.storm.open_loop.unwrap_or_default();
    let mut steps = Vec::new();
    let mut best: f64 = 0.0;
    let mut saturated_in_a_row = 0;
    let mut stopped = format!("reached the last step ({})", config.max_steps);
    for index in 0..config.max_steps {
        let storm = StormConfig {
            open_loop: Some(OpenLoop {
                rate: config.rate(index),
                ..base
            }),
            seed: config.storm.seed.wrapping_add(index as u64),
            ..config.storm.clone()
        };
        let report = run_storm_until(&storm, stop).await?;
        if report.interrupted {
            stopped = "interrupted".to_owned();
            break;
        }
        let open_loop = report.open_loop.as_ref();
        let goodput = report.overload.goodput_rps.unwrap_or(0.0);
        let rate_achieved = open_loop.map_or(0.0, |o| o.rate_achieved);
        let step = SweepStep {
            rate_asked: config.rate(index),
            rate_achieved,
            goodput_rps: goodput,
            ttft_p99_ms: report.ttft.p99_ms,
            answered: report.overload.answered,
            shed: report.overload.shed,
            unclean: report.overload.unclean(),
            peak_in_flight: open_loop.map_or(0, |o| o.peak_in_flight),
            saturated: goodput < SATURATED_SHARE * rate_achieved,
        };
        on_step(&step);
        let (unclean, saturated) = (step.unclean, step.saturated);
        steps.push(step);
        if unclean > 0 {
            stopped = format!("{unclean} requests were neither answered nor shed cleanly");
            break;
        }
        if goodput < FALLING_SHARE * best {
            stopped = format!("goodput fell to {goodput:.1} req/s from {best:.1}");
            break;
        }
        best = best.max(goodput);
        saturated_in_a_row = if saturated { saturated_in_a_row + 1 } else { 0 };
        if saturated_in_a_row >= config.saturated_steps {
            stopped = format!("saturated for {saturated_in_a_row} steps in a row");
            break;
        }
    }
    Ok(SweepReport {
        capacity_rps: steps.iter().map(|s| s.goodput_rps).fold(0.0, f64::max),
        knee_rps: steps
            .iter()
            .filter(|s| !s.saturated)
            .map(|s| s.rate_asked)
            .reduce(f64::max),
        steps,
        stopped,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rates_rise_by_step_or_factor_and_bad_sweeps_are_refused() {
        let mut config = SweepConfig {
            storm: StormConfig {
                slo_ttft: Some(Duration::from_millis(500)),
                ..StormConfig::default()
            },
            start_rate: 2.0,
            step: RateStep::Add(2.0),
            max_steps: 5,
            saturated_steps: 2,
        };
        assert_eq!(
            (0..3).map(|i| config.rate(i)).collect::<Vec<_>>(),
            [2.0, 4.0, 6.0]
        );
        assert!(config.check().is_ok());
        config.step = RateStep::Multiply(1.5);
        assert_eq!(
            (0..3).map(|i| config.rate(i)).collect::<Vec<_>>(),
            [2.0, 3.0, 4.5]
        );
        config.step = RateStep::Multiply(1.0);
        assert!(config.check().is_err());
        config.step = RateStep::Add(1.0);
        config.storm.slo_ttft = None;
        assert!(format!("{}", config.check().unwrap_err()).contains("--slo-ttft-ms"));
    }
}
