//! The open-loop flags of `bch-drill storm` (`--rate` and its companions) and the flags of
//! `bch-drill sweep`.

use std::path::PathBuf;
use std::time::Duration;

use bch_drill::storm::{Arrival, OpenLoop, RateStep, StormConfig, SweepConfig};
use clap::Args;
use reqwest::Url;

use crate::StormOpts;

/// Open-loop sending and the TTFT objective, shared by `storm` and `sweep`.
#[derive(Debug, Args)]
pub(crate) struct RateOpts {
    /// How arrivals are spread: poisson (independent arrivals), constant (evenly spaced) or burst
    /// (--burst-size requests at once, bursts evenly spaced).
    #[arg(long, value_parser = parse_arrival, default_value = "poisson")]
    arrival: Arrival,
    /// Requests per burst with --arrival burst.
    #[arg(long, default_value_t = OpenLoop::default().burst_size)]
    burst_size: usize,
    /// Seconds of sending (per step, for a sweep); the storm then waits for the answers still
    /// outstanding.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// TTFT objective in milliseconds: the report counts the answers within it per second as
    /// goodput.
    #[arg(long)]
    slo_ttft_ms: Option<u64>,
}

fn parse_arrival(s: &str) -> Result<Arrival, String> {
    s.parse()
}

impl RateOpts {
    /// The open loop at `rate` requests per second.
    pub(crate) fn open_loop(&self, rate: f64) -> anyhow::Result<OpenLoop> {
        anyhow::ensure!(
            self.duration.is_finite() && self.duration > 0.0,
            "--duration must be a positive number of seconds"
        );
        Ok(OpenLoop {
            rate,
            arrival: self.arrival,
            duration: Duration::from_secs_f64(self.duration),
            burst_size: self.burst_size,
        })
    }

    /// The TTFT objective.
    pub(crate) fn slo_ttft(&self) -> Option<Duration> {
        self.slo_ttft_ms.map(Duration::from_millis)
    }
}

/// `bch-drill sweep`.
#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    pub(crate) storm: StormOpts,
    #[command(flatten)]
    pub(crate) rate: RateOpts,
    /// Rate of the first step, requests per second.
    #[arg(long, default_value_t = 1.0)]
    start_rate: f64,
    /// Requests per second added at each step.
    #[arg(long, conflicts_with = "factor")]
    step: Option<f64>,
    /// Factor the rate is multiplied by at each step (default 1.5 when no --step is given).
    #[arg(long)]
    factor: Option<f64>,
    /// Most steps.
    #[arg(long, default_value_t = 10)]
    max_steps: usize,
    /// Stop after this many saturated steps in a row (goodput below 90% of the rate achieved).
    #[arg(long, default_value_t = 2)]
    saturated_steps: usize,
    /// Control-plane URL; when given, each step checks that every worker's load returns to 0.
    #[arg(long, env = "BCH_CONTROL", value_delimiter = ',')]
    pub(crate) control: Vec<Url>,
    /// Also write the sweep as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
}

impl SweepArgs {
    /// The sweep these flags describe, its storms with prompt seed `seed`.
    pub(crate) fn config(&self, seed: u64) -> anyhow::Result<SweepConfig> {
        let mut storm = StormConfig {
            progress: false,
            open_loop: Some(self.rate.open_loop(self.start_rate)?),
            slo_ttft: self.rate.slo_ttft(),
            ..self.storm.config(self.control.first().cloned(), seed)
        };
        storm.replica_controls = self.control.iter().skip(1).cloned().collect();
        let step = match (self.step, self.factor) {
            (Some(add), _) => RateStep::Add(add),
            (None, factor) => RateStep::Multiply(factor.unwrap_or(1.5)),
        };
        Ok(SweepConfig {
            storm,
            start_rate: self.start_rate,
            step,
            max_steps: self.max_steps,
            saturated_steps: self.saturated_steps,
        })
    }
}
