//! What one source does with each resolution's outcome: the safety rules, pure (time is passed
//! in), so they are tested without a resolver or a clock.
//!
//! - Workers: applied.
//! - A failure (resolver error, timeout, SERVFAIL or any other error code): the set in force stays;
//!   never an empty fleet because DNS hiccuped. The outage is reported once when it begins and
//!   once when it ends, not on every failed refresh (each is counted in the metrics).
//! - An empty answer (NXDOMAIN, no records, or only bad records): the set in force stays until the
//!   answers have been empty for `empty_after_ms`, then the source is emptied. A Deployment scaled
//!   to zero does empty its source; a zone briefly served without its records does not.

use std::time::{Duration, Instant};

use crate::admin::DiscoveredWorker;

/// One resolution's outcome, as the rules see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The answer gave these workers (at least one).
    Workers(Vec<DiscoveredWorker>),
    /// The answer was empty; why (`NXDOMAIN`, `no records`, `every record was skipped`).
    Empty(String),
    /// The resolution failed; why.
    Failed(String),
}

/// Something worth one log line.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Resolutions began failing; `kept` workers stay in force.
    OutageBegan {
        /// The first failure.
        reason: String,
        /// Workers of this source that stay.
        kept: usize,
    },
    /// The resolver answers again after `failures` failed resolutions over `lasted`.
    OutageEnded {
        /// Failed resolutions in the outage.
        failures: u64,
        /// From the first failure to the first answer.
        lasted: Duration,
    },
    /// Answers became empty; `kept` workers stay until `empty_after` passes.
    EmptyBegan {
        /// Why the answer was empty.
        reason: String,
        /// Workers of this source that stay for now.
        kept: usize,
        /// How long the answers must stay empty before the source is emptied.
        empty_after: Duration,
    },
    /// The answers stayed empty for `lasted`: the source's `removed` workers were removed.
    Emptied {
        /// Workers removed.
        removed: usize,
        /// Since the first empty answer.
        lasted: Duration,
    },
    /// Records are back after empty answers (before the source was emptied, or after).
    RecordsBack,
}

/// What to do after one observation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// The set to put in force, when it is to change (an unchanged set changes nothing there).
    pub apply: Option<Vec<DiscoveredWorker>>,
    /// What to log.
    pub events: Vec<Event>,
}

/// The rules' memory for one source.
#[derive(Debug)]
pub struct Safety {
    empty_after: Duration,
    /// Workers of the set last put in force.
    in_force: usize,
    /// First failure and failures since, while resolutions fail.
    outage: Option<(Instant, u64)>,
    /// First empty answer, while answers are empty.
    empty_since: Option<Instant>,
}

impl Safety {
    /// Rules that empty a source after `empty_after` of empty answers, for a source that has
    /// `in_force` workers now (0 at start; a source restarted by a reload keeps its set).
    pub fn new(empty_after: Duration, in_force: usize) -> Self {
        Self {
            empty_after,
            in_force,
            outage: None,
            empty_since: None,
        }
    }

    /// Applies the rules to one outcome seen at `now`.
    pub fn observe(&mut self, observation: Observation, now: Instant) -> Verdict {
        let mut verdict = Verdict::default();
        if !matches!(observation, Observation::Failed(_))
            && let Some((since, failures)) = self.outage.take()
        {
            verdict.events.push(Event::OutageEnded {
                failures,
                lasted: now.duration_since(since),
            });
        }
        match observation {
            Observation::Workers(workers) => {
                if self.empty_since.take().is_some() {
                    verdict.events.push(Event::RecordsBack);
                }
                self.in_force = workers.len();
                verdict.apply = Some(workers);
            }
            Observation::Failed(reason) => match &mut self.outage {
                Some((_, failures)) => *failures += 1,
                None => {
                    self.outage = Some((now, 1));
                    verdict.events.push(Event::OutageBegan {
                        reason,
                        kept: self.in_force,
                    });
                }
            },
            Observation::Empty(reason) => self.empty(reason, now, &mut verdict),
        }
        verdict
    }

    fn empty(&mut self, reason: String, now: Instant, verdict: &mut Verdict) {
        if self.in_force == 0 {
            // Nothing to keep (the first answer, or emptied already).
            self.empty_since.get_or_insert(now);
            verdict.apply = Some(Vec::new());
            return;
        }
        let empty_after = self.empty_after;
        let since = *self.empty_since.get_or_insert_with(|| {
            // With no grace period there is nothing to wait for, only the removal to report.
            if !empty_after.is_zero() {
                verdict.events.push(Event::EmptyBegan {
                    reason,
                    kept: self.in_force,
                    empty_after,
                });
            }
            now
        });
        let lasted = now.duration_since(since);
        if lasted >= self.empty_after {
            verdict.events.push(Event::Emptied {
                removed: self.in_force,
                lasted,
            });
            self.in_force = 0;
            verdict.apply = Some(Vec::new());
        }
    }
}

/// When to resolve again after an answer valid for `ttl`: at the latest after `interval`, sooner
/// when the TTL runs out first, but never sooner than a second after (a TTL of 0 would otherwise
/// make a busy loop) unless `interval` itself is shorter.
pub fn next_refresh(interval: Duration, ttl: Option<Duration>) -> Duration {
    let ttl = ttl.map_or(interval, |ttl| ttl.max(Duration::from_secs(1)));
    interval.min(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: u16) -> Vec<DiscoveredWorker> {
        (0..n)
            .map(|i| DiscoveredWorker {
                addr: ([127, 0, 0, 1], 8000 + i).into(),
                name: None,
            })
            .collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn failures_keep_the_set_and_are_reported_once_per_outage() {
        let t0 = Instant::now();
        let mut safety = Safety::new(ms(30_000), 0);
        assert_eq!(
            safety.observe(Observation::Workers(workers(3)), t0).apply,
            Some(workers(3))
        );
        let first = safety.observe(Observation::Failed("timeout".into()), t0 + ms(10));
        assert_eq!(first.apply, None);
        assert_eq!(
            first.events,
            [Event::OutageBegan {
                reason: "timeout".into(),
                kept: 3
            }]
        );
        for i in 2..=100 {
            let later = safety.observe(Observation::Failed("SERVFAIL".into()), t0 + ms(10 * i));
            assert_eq!(later, Verdict::default(), "kept, and silent");
        }
        let back = safety.observe(Observation::Workers(workers(2)), t0 + ms(2_000));
        assert_eq!(back.apply, Some(workers(2)));
        assert_eq!(
            back.events,
            [Event::OutageEnded {
                failures: 100,
                lasted: ms(1_990)
            }]
        );
    }

    #[test]
    fn empty_answers_empty_the_source_only_after_empty_after() {
        let t0 = Instant::now();
        let mut safety = Safety::new(ms(30_000), 0);
        safety.observe(Observation::Workers(workers(3)), t0);
        let began = safety.observe(Observation::Empty("NXDOMAIN".into()), t0 + ms(1));
        assert_eq!(began.apply, None, "kept");
        assert_eq!(began.events.len(), 1);
        // A failure in between neither empties nor restarts the clock.
        assert_eq!(
            safety
                .observe(Observation::Failed("timeout".into()), t0 + ms(15_000))
                .apply,
            None
        );
        let still = safety.observe(Observation::Empty("NXDOMAIN".into()), t0 + ms(30_000));
        assert_eq!(still.apply, None, "29.999 s of empty answers keep the set");
        let gone = safety.observe(Observation::Empty("NXDOMAIN".into()), t0 + ms(30_001));
        assert_eq!(gone.apply, Some(Vec::new()));
        assert!(gone.events.contains(&Event::Emptied {
            removed: 3,
            lasted: ms(30_000)
        }));
        let back = safety.observe(Observation::Workers(workers(1)), t0 + ms(40_000));
        assert_eq!(back.apply, Some(workers(1)));
        assert!(back.events.contains(&Event::RecordsBack));
    }

    #[test]
    fn records_back_before_empty_after_keep_the_set_without_a_gap() {
        let t0 = Instant::now();
        let mut safety = Safety::new(ms(30_000), 0);
        safety.observe(Observation::Workers(workers(3)), t0);
        safety.observe(Observation::Empty("no records".into()), t0 + ms(1));
        let back = safety.observe(Observation::Workers(workers(3)), t0 + ms(29_000));
        assert_eq!(
            (back.apply, back.events),
            (Some(workers(3)), vec![Event::RecordsBack])
        );
        // The clock starts again from the next empty answer.
        safety.observe(Observation::Empty("no records".into()), t0 + ms(29_500));
        let kept = safety.observe(Observation::Empty("no records".into()), t0 + ms(40_000));
        assert_eq!(kept.apply, None);
    }

    #[test]
    fn a_source_restarted_with_workers_in_force_keeps_them_through_empty_answers() {
        let t0 = Instant::now();
        let mut restarted = Safety::new(ms(30_000), 4);
        let empty = restarted.observe(Observation::Empty("NXDOMAIN".into()), t0);
        assert_eq!(empty.apply, None);
        assert!(matches!(
            empty.events[..],
            [Event::EmptyBegan { kept: 4, .. }]
        ));
    }

    #[test]
    fn an_empty_first_answer_and_a_zero_empty_after_apply_at_once() {
        let t0 = Instant::now();
        let mut first = Safety::new(ms(30_000), 0);
        assert_eq!(
            first
                .observe(Observation::Empty("NXDOMAIN".into()), t0)
                .apply,
            Some(Vec::new())
        );
        let mut eager = Safety::new(Duration::ZERO, 0);
        eager.observe(Observation::Workers(workers(2)), t0);
        let emptied = eager.observe(Observation::Empty("NXDOMAIN".into()), t0);
        assert_eq!(emptied.apply, Some(Vec::new()));
        assert_eq!(
            emptied.events,
            [Event::Emptied {
                removed: 2,
                lasted: Duration::ZERO
            }]
        );
    }

    #[test]
    fn the_next_refresh_is_the_interval_or_the_ttl_whichever_is_first_but_not_below_a_second() {
        assert_eq!(next_refresh(ms(5_000), Some(ms(30_000))), ms(5_000));
        assert_eq!(next_refresh(ms(5_000), Some(ms(2_000))), ms(2_000));
        assert_eq!(next_refresh(ms(5_000), Some(Duration::ZERO)), ms(1_000));
        assert_eq!(next_refresh(ms(100), Some(Duration::ZERO)), ms(100));
        assert_eq!(next_refresh(ms(5_000), None), ms(5_000));
    }
}
