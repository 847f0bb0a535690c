//! The open-loop flags of `bch-drill storm` (`--rate` and its companions) and the flags of
//! `bch-drill sweep`.

use std::path::PathBuf;
use std::time::Duration;

use bch_drill::storm::{Arrival, OpenLoop, RateStep, StormConfig, SweepConfig};
use clap::Args;
use reqwest::Url;

use crate::StormOpts;

/// `--rate` and the open-loop flags, for `storm` and `ab`.
#[derive(Debug, Args)]
pub(crate) struct OpenLoopArgs {
    /// Send open-loop at this many requests per second, one request per arrival, whatever is
    /// outstanding (--groups, --siblings and --concurrency then do not apply). Without it the
    /// storm is closed-loop.
    #[arg(long)]
    rate: Option<f64>,
    #[command(flatten)]
    opts: RateOpts,
}

impl OpenLoopArgs {
    /// `config` made open-loop when `--rate` is given, with the TTFT objective either way.
    pub(crate) fn apply(&self, config: &mut StormConfig) -> anyhow::Result<()> {
        config.open_loop = self
            .rate
            .map(|rate| self.opts.open_loop(rate))
            .transpose()?;
        config.slo_ttft = self.opts.slo_ttft();
        Ok(())
    }
}

/// Open-loop sending and the TTFT objective, shared by `storm`, `ab` and `sweep`.
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
        // Each step draws its progress bar (on a terminal) between the lines of the steps.
        let mut storm = StormConfig {
            progress: true,
            tls: self.storm.tls.client_tls()?,
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn rate_turns_the_storm_open_loop_and_sweep_steps_add_or_multiply() {
        let storm = |extra: &[&str]| {
            let cli = Cli::try_parse_from(
                ["bch-drill", "storm", "--gateway", "http://127.0.0.1:8080"]
                    .iter()
                    .chain(extra),
            )?;
            let Command::Storm(args) = cli.command else {
                panic!("not storm")
            };
            let mut config = args.storm.config(None, 1);
            args.open_loop.apply(&mut config).map_err(|e| {
                clap::Error::raw(clap::error::ErrorKind::InvalidValue, e.to_string())
            })?;
            Ok::<_, clap::Error>((config, args.records))
        };
        let (closed, records) = storm(&[]).unwrap();
        assert_eq!(
            (closed.open_loop, closed.slo_ttft, records),
            (None, None, None)
        );
        let (open, records) = storm(&[
            "--rate",
            "40",
            "--arrival",
            "burst",
            "--burst-size",
            "4",
            "--duration",
            "2.5",
            "--slo-ttft-ms",
            "500",
            "--records",
            "r.jsonl",
        ])
        .unwrap();
        assert_eq!(
            open.open_loop,
            Some(OpenLoop {
                rate: 40.0,
                arrival: Arrival::Burst,
                duration: Duration::from_millis(2500),
                burst_size: 4,
            })
        );
        assert_eq!(open.slo_ttft, Some(Duration::from_millis(500)));
        assert_eq!(records, Some(PathBuf::from("r.jsonl")));
        assert!(storm(&["--rate", "4", "--arrival", "steady"]).is_err());
        assert!(storm(&["--rate", "4", "--duration", "0"]).is_err());

        let sweep = |extra: &[&str]| {
            let cli = Cli::try_parse_from(
                [
                    "bch-drill",
                    "sweep",
                    "--gateway",
                    "http://a",
                    "--slo-ttft-ms",
                    "300",
                ]
                .iter()
                .chain(extra),
            )?;
            let Command::Sweep(args) = cli.command else {
                panic!("not sweep")
            };
            Ok::<_, clap::Error>(args.config(1).unwrap())
        };
        assert_eq!(sweep(&[]).unwrap().step, RateStep::Multiply(1.5));
        let added = sweep(&["--start-rate", "2", "--step", "3", "--max-steps", "4"]).unwrap();
        assert_eq!(
            (added.step, added.start_rate, added.max_steps),
            (RateStep::Add(3.0), 2.0, 4)
        );
        assert_eq!(added.storm.slo_ttft, Some(Duration::from_millis(300)));
        assert_eq!(added.storm.open_loop.unwrap().rate, 2.0);
        assert!(sweep(&["--step", "3", "--factor", "2"]).is_err());
    }
}
