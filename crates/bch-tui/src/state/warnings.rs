//! The warnings pane's content: what is wrong with the fleet and why, one sentence per problem,
//! computed from the console state alone (no I/O, the time passed in), so each rule is a unit
//! test. The view draws them in the `w` panel and, closed, sums them up on the header's last
//! line.

use bch_core::telemetry::{DiscoveryState, WorkerState};
use tokio::time::Instant;

use super::State;
use super::warning::Warning;
use crate::conn::ConnStatus;

/// The recent window of the spill-surge rule, seconds.
const SURGE_RECENT_S: u64 = 10;
/// The window before it that the recent rate is compared with, seconds.
const SURGE_BEFORE_S: u64 = 60;
/// A surge is a recent rate at least this many times the rate before it…
const SURGE_FACTOR: f64 = 3.0;
/// …and at least this many spills per second (a handful of spills is no surge).
const SURGE_FLOOR_PER_S: f64 = 1.0;
/// A scrape this old (milliseconds) is reported even while the rule still reads it.
const SCRAPE_OLD_MS: u64 = 10_000;

impl State {
    /// Every problem the console knows of at `now`, most serious first (ties keep the order
    /// replicas, workers, discovery, admission, spills).
    pub fn warnings(&self, now: Instant) -> Vec<Warning> {
        let mut out = self.replica_warnings(now);
        out.extend(self.worker_warnings(now));
        out.extend(self.discovery_warnings());
        out.extend(self.admission_warnings());
        out.extend(self.surge_warning());
        out.sort_by_key(|w| std::cmp::Reverse(w.severity));
        out
    }

    /// Replicas down, silent, or configured unlike the others.
    fn replica_warnings(&self, now: Instant) -> Vec<Warning> {
        let differing = self.differing();
        let mut out = Vec::new();
        for (i, replica) in self.replicas.iter().enumerate() {
            let name = replica.url();
            match replica.conn() {
                ConnStatus::Reconnecting {
                    attempt, reason, ..
                } => out.push(Warning::alert(format!(
                    "replica {name} is disconnected: attempt {attempt} failed: {reason}"
                ))),
                ConnStatus::Connected if replica.stale(now) => {
                    let age = replica.frame_age(now).unwrap_or_default();
                    out.push(Warning::alert(format!(
                        "replica {name} sent no frame for {:.0}s: the gateway may be frozen",
                        age.as_secs_f64()
                    )));
                }
                _ => {}
            }
            if differing.get(i).copied().unwrap_or(false) {
                out.push(Warning::notice(format!(
                    "replica {name} has thresholds unlike the other replicas: they route the same key differently"
                )));
            }
        }
        out
    }

    /// Workers failing probes, reading a stale or old scrape, draining too long, full.
    fn worker_warnings(&self, now: Instant) -> Vec<Warning> {
        let mut out = Vec::new();
        for w in &self.whole().workers {
            let name = &w.name;
            if let Some(why) = &w.probe_failure {
                out.push(Warning::alert(format!(
                    "worker {name} fails its health probes: {why}"
                )));
            } else if !w.healthy {
                out.push(Warning::alert(format!(
                    "worker {name} is unhealthy (failed probes or requests): it gets no new request"
                )));
            }
            if w.load_stale {
                let age = match w.scrape_age_ms {
                    Some(ms) => format!("its last good scrape is {:.1}s old", ms as f64 / 1000.0),
                    None => "it was never scraped".to_owned(),
                };
                out.push(Warning::notice(format!(
                    "worker {name}'s load scrape is stale ({age}): the rule reads this gateway's own load for it"
                )));
            } else if let Some(ms) = w.scrape_age_ms.filter(|ms| *ms >= SCRAPE_OLD_MS) {
                out.push(Warning::notice(format!(
                    "worker {name}'s load scrape is {:.0}s old: its metrics endpoint answers slowly or not at all",
                    ms as f64 / 1000.0
                )));
            }
            if let Some(since) = self.draining_since.get(name) {
                let long = now.saturating_duration_since(*since);
                if long >= self.drain_warning {
                    out.push(Warning::notice(format!(
                        "worker {name} has been draining for {} min: {} request(s) still in flight",
                        long.as_secs() / 60,
                        w.active
                    )));
                }
            }
            if w.full {
                let cap = w
                    .capacity
                    .map(|c| format!("at its capacity of {c}"))
                    .unwrap_or_else(|| "its engine reported saturation".to_owned());
                out.push(Warning::notice(format!(
                    "worker {name} is full ({cap}): it takes no new request"
                )));
            }
        }
        out
    }

    /// Discovery sources whose last resolution failed or found nothing.
    fn discovery_warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        for source in &self.whole().discovery {
            let name = &source.name;
            let why = source.last_error.as_deref().unwrap_or("no reason given");
            match source.state.known() {
                Some(DiscoveryState::Failing) => out.push(Warning::alert(format!(
                    "discovery of {name} fails ({why}): its last good {} worker(s) are kept",
                    source.workers
                ))),
                Some(DiscoveryState::Empty) => out.push(Warning::notice(format!(
                    "discovery of {name} found no worker ({why})"
                ))),
                _ => {}
            }
        }
        out
    }

    /// A gateway that sheds requests (its admission queue is full or off).
    fn admission_warnings(&self) -> Vec<Warning> {
        let Some(admission) = &self.whole().admission else {
            return Vec::new();
        };
        if admission.shed_per_s <= 0.0 {
            return Vec::new();
        }
        let by = &admission.shed_per_s_by_reason;
        vec![Warning::alert(format!(
            "the gateway sheds {:.1} req/s: every candidate worker is full ({:.1}/s with no queue, {:.1}/s queue full, {} waiting)",
            admission.shed_per_s, by.no_queue, by.queue_full, admission.waiting
        ))]
    }

    /// A spill surge: spills/s over the last [`SURGE_RECENT_S`] s at least [`SURGE_FACTOR`] times
    /// the rate over the [`SURGE_BEFORE_S`] s before (or as much of it as the rate history holds),
    /// and at least [`SURGE_FLOOR_PER_S`].
    fn surge_warning(&self) -> Option<Warning> {
        let picture = self.whole();
        let tick_ms = picture.tick_interval_ms.unwrap_or(100).max(1);
        let recent_n = (SURGE_RECENT_S * 1000).div_ceil(tick_ms) as usize;
        let before_n = (SURGE_BEFORE_S * 1000).div_ceil(tick_ms) as usize;
        let samples: Vec<f64> = picture.history.iter().map(|s| s.spills_per_s).collect();
        if samples.len() < recent_n + 1 {
            return None;
        }
        let (before, recent) = samples.split_at(samples.len() - recent_n);
        let before = &before[before.len().saturating_sub(before_n)..];
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let (recent, before) = (mean(recent), mean(before));
        (recent >= SURGE_FLOOR_PER_S && recent >= SURGE_FACTOR * before).then(|| {
            Warning::notice(format!(
                "spill surge: {recent:.1} spills/s over the last {SURGE_RECENT_S}s against {before:.1}/s before: keys are leaving their home workers"
            ))
        })
    }

    /// Notes when each worker of the live picture began draining, as seen by this console at
    /// `now` (the gateway does not say), and forgets the ones no longer draining.
    pub(super) fn track_draining(&mut self, now: Instant) {
        let draining: Vec<String> = self
            .live()
            .workers
            .iter()
            .filter(|w| w.state.known() == Some(&WorkerState::Draining))
            .map(|w| w.name.clone())
            .collect();
        self.draining_since
            .retain(|name, _| draining.contains(name));
        for name in draining {
            self.draining_since.entry(name).or_insert(now);
        }
    }
}
