//! When an open-loop storm sends: [`OpenLoop`] (rate, arrival process, duration) and the schedule
//! it gives, every arrival's time as an offset from the start of the storm. The schedule is made
//! before the first request and read against the start time, so a slow machine makes requests
//! late (and the storm records by how much) but never shifts the ones after them.

use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// How arrivals are spread in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// A Poisson process: independent arrivals, exponential gaps of mean `1 / rate` (what many
    /// independent clients produce, and vLLM's `bench serve --request-rate` default). The default.
    #[default]
    Poisson,
    /// Evenly spaced, one every `1 / rate` seconds.
    Constant,
    /// `burst_size` requests at the same instant, bursts evenly spaced every `burst_size / rate`
    /// seconds: the same mean rate as the others, delivered in clumps.
    Burst,
}

impl Arrival {
    /// The name `--arrival` takes: `poisson`, `constant` or `burst`.
    pub fn as_str(self) -> &'static str {
        match self {
            Arrival::Poisson => "poisson",
            Arrival::Constant => "constant",
            Arrival::Burst => "burst",
        }
    }
}

impl std::str::FromStr for Arrival {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "poisson" => Ok(Arrival::Poisson),
            "constant" => Ok(Arrival::Constant),
            "burst" => Ok(Arrival::Burst),
            other => Err(format!(
                "arrival must be poisson, constant or burst, got {other:?}"
            )),
        }
    }
}

/// An open-loop storm: requests sent at a rate for a duration, whatever is outstanding.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OpenLoop {
    /// Mean arrival rate, requests per second.
    pub rate: f64,
    /// How arrivals are spread in time.
    pub arrival: Arrival,
    /// How long requests are sent; the storm then waits for the answers still outstanding.
    #[serde(rename = "duration_s", serialize_with = "seconds")]
    pub duration: Duration,
    /// Requests per burst with [`Arrival::Burst`] (ignored otherwise). At least 1.
    pub burst_size: usize,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for OpenLoop {
    /// 10 requests per second, Poisson, for 30 s; bursts of 10.
    fn default() -> Self {
        Self {
            rate: 10.0,
            arrival: Arrival::Poisson,
            duration: Duration::from_secs(30),
            burst_size: 10,
        }
    }
}

impl OpenLoop {
    /// Refuses a rate that is not a positive finite number, a zero duration or an empty burst.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.rate.is_finite() && self.rate > 0.0,
            "rate must be a positive number of requests per second, got {}",
            self.rate
        );
        anyhow::ensure!(!self.duration.is_zero(), "duration must be above 0");
        anyhow::ensure!(self.burst_size > 0, "burst size must be at least 1");
        Ok(())
    }

    /// Every arrival before `duration`, as offsets from the start, ascending; Poisson gaps drawn
    /// from `seed`, so one seed gives one schedule.
    pub(crate) fn schedule(&self, seed: u64) -> Vec<Duration> {
        let end = self.duration.as_secs_f64();
        let mut times = Vec::new();
        match self.arrival {
            Arrival::Constant => {
                let gap = 1.0 / self.rate;
                times.extend((0..).map(|i| i as f64 * gap).take_while(|&t| t < end));
            }
            Arrival::Burst => {
                let gap = self.burst_size as f64 / self.rate;
                for burst in (0..).map(|i| i as f64 * gap).take_while(|&t| t < end) {
                    times.extend(std::iter::repeat_n(burst, self.burst_size));
                }
            }
            Arrival::Poisson => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6f70_656e_6c6f_6f70);
                let mut t = 0.0;
                loop {
                    // 1 - U is in (0, 1]: its logarithm is finite.
                    let u: f64 = rng.random();
                    t += -(1.0 - u).ln() / self.rate;
                    if t >= end {
                        break;
                    }
                    times.push(t);
                }
            }
        }
        times.into_iter().map(Duration::from_secs_f64).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_loop(arrival: Arrival, rate: f64, seconds: u64) -> OpenLoop {
        OpenLoop {
            rate,
            arrival,
            duration: Duration::from_secs(seconds),
            burst_size: 5,
        }
    }

    #[test]
    fn every_arrival_process_keeps_the_mean_rate_within_the_duration() {
        for arrival in [Arrival::Constant, Arrival::Burst, Arrival::Poisson] {
            let schedule = open_loop(arrival, 50.0, 100).schedule(3);
            let n = schedule.len() as f64;
            assert!((n - 5000.0).abs() < 5000.0 * 0.03, "{arrival:?}: {n}");
            assert!(schedule.windows(2).all(|w| w[0] <= w[1]), "{arrival:?}");
            assert!(schedule.iter().all(|t| *t < Duration::from_secs(100)));
        }
    }

    #[test]
    fn the_shapes_differ_as_documented() {
        let constant = open_loop(Arrival::Constant, 4.0, 1).schedule(0);
        assert_eq!(
            constant,
            [0.0, 0.25, 0.5, 0.75].map(Duration::from_secs_f64)
        );
        let burst = open_loop(Arrival::Burst, 10.0, 1).schedule(0);
        assert_eq!(
            burst,
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5].map(Duration::from_secs_f64)
        );
        // Poisson: exponential gaps, whose standard deviation equals their mean.
        let poisson = open_loop(Arrival::Poisson, 100.0, 100).schedule(7);
        let gaps: Vec<f64> = poisson
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.05, "cv {}", sd / mean);
        assert_eq!(poisson, open_loop(Arrival::Poisson, 100.0, 100).schedule(7));
        assert_ne!(poisson, open_loop(Arrival::Poisson, 100.0, 100).schedule(8));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(open_loop(Arrival::Poisson, 0.0, 1).check().is_err());
        assert!(
            open_loop(Arrival::Poisson, f64::INFINITY, 1)
                .check()
                .is_err()
        );
        assert!(open_loop(Arrival::Poisson, 1.0, 0).check().is_err());
        assert!("poison".parse::<Arrival>().is_err());
        assert_eq!("burst".parse::<Arrival>(), Ok(Arrival::Burst));
    }
}
