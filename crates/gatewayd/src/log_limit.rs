//! A budget for repeated state-change log lines: at most `lines` per source (a discovery source, a
//! worker's scrapes, a worker's probes) per `period`, then silence until the period ends, and one
//! summary line saying how many were suppressed. A DNS name flapping every 100 ms, or a worker
//! whose scrapes alternate good and bad, would otherwise write a line per change for as long as it
//! flaps. Only the lines are limited: every state still changes, is counted and shown as before.
//!
//! Pure logic with the time passed in, so it is tested without sleeping. A leaf module: the
//! scraper, the prober and discovery each own limiters, and all count into one
//! [`SuppressedLines`].

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::config::LogConfig;
use crate::metrics::{LabelValue, by_label, counter};

/// How many lines a source may log, per how long (`[log] state_change_lines` and
/// `state_change_period_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineBudget {
    /// Lines per source per period (at least 1).
    pub lines: u32,
    /// The period; a source's period starts at its first line after the last one ended.
    pub period: Duration,
}

impl LineBudget {
    /// The budget `[log]` sets.
    pub fn of(log: &LogConfig) -> Self {
        Self {
            lines: log.state_change_lines,
            period: log.state_change_period,
        }
    }
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Log it. `suppressed` lines of this source were dropped since its last logged line and not
    /// yet summarised: say so with it.
    Log {
        /// Lines dropped before this one and not yet reported.
        suppressed: u64,
    },
    /// Drop it (the caller counts it in [`SuppressedLines`]).
    Suppress,
}

/// One source's period: when it began, lines logged in it, lines dropped and not yet reported.
#[derive(Debug, Clone, Copy)]
struct Window {
    began: Instant,
    logged: u32,
    suppressed: u64,
}

/// The per-source budgets of one component, keyed by source (a worker key, a source label).
#[derive(Debug)]
pub struct LogLimiter<K> {
    budget: LineBudget,
    sources: HashMap<K, Window>,
}

impl<K: Hash + Eq + Clone> LogLimiter<K> {
    /// A limiter granting every source `budget`.
    pub fn new(budget: LineBudget) -> Self {
        Self {
            budget: LineBudget {
                lines: budget.lines.max(1),
                ..budget
            },
            sources: HashMap::new(),
        }
    }

    /// Whether `source` may log a line at `now`; a line admitted after suppressed ones carries
    /// their count.
    pub fn admit(&mut self, source: &K, now: Instant) -> Admit {
        let budget = self.budget;
        let window = self.sources.entry(source.clone()).or_insert(Window {
            began: now,
            logged: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(window.began) >= budget.period {
            // The suppressed count outlives its period until it is reported, here or by `flush`.
            window.began = now;
            window.logged = 0;
        }
        if window.logged < budget.lines {
            window.logged += 1;
            Admit::Log {
                suppressed: std::mem::take(&mut window.suppressed),
            }
        } else {
            window.suppressed += 1;
            Admit::Suppress
        }
    }

    /// The sources whose period ended by `now` with lines suppressed and not yet reported, and
    /// how many: each is reported once, so the caller logs a summary with the source's current
    /// state (the last line it logged may no longer be true).
    pub fn flush(&mut self, now: Instant) -> Vec<(K, u64)> {
        let period = self.budget.period;
        let mut due = Vec::new();
        for (source, window) in &mut self.sources {
            if window.suppressed > 0 && now.saturating_duration_since(window.began) >= period {
                due.push((source.clone(), std::mem::take(&mut window.suppressed)));
            }
        }
        // Sources quiet for a whole period have nothing to remember: their next line starts a
        // new period anyway.
        self.sources.retain(|_, window| {
            window.suppressed > 0 || now.saturating_duration_since(window.began) < period
        });
        due
    }
}

/// A component's limiter with the counter it counts into: what the scraper, the prober and each
/// discovery source hold.
#[derive(Debug)]
pub struct LimitedLog<K> {
    limiter: LogLimiter<K>,
    component: Component,
    suppressed: Arc<SuppressedLines>,
}

impl<K: Hash + Eq + Clone> LimitedLog<K> {
    /// `component`'s limiter granting each source `budget`, counting into `suppressed`.
    pub fn new(component: Component, budget: LineBudget, suppressed: Arc<SuppressedLines>) -> Self {
        Self {
            limiter: LogLimiter::new(budget),
            component,
            suppressed,
        }
    }

    /// Whether a state-change line of `source` (shown as `name`) may be logged at `now`. A
    /// suppressed one is counted; an admitted one after suppressed ones is preceded by a line
    /// saying how many.
    pub fn admit(&mut self, source: &K, name: &str, now: Instant) -> bool {
        match self.limiter.admit(source, now) {
            Admit::Log { suppressed } => {
                if suppressed > 0 {
                    self.summary(name, suppressed, None);
                }
                true
            }
            Admit::Suppress => {
                self.suppressed.record(self.component);
                false
            }
        }
    }

    /// Logs one summary line for each source whose period ended with lines suppressed and not
    /// yet reported, with its current state as `state_of` tells it (`None`: a source that is
    /// gone, summarised without a state). Call it once per round or refresh.
    pub fn flush(&mut self, now: Instant, state_of: impl Fn(&K) -> (String, Option<String>)) {
        for (source, suppressed) in self.limiter.flush(now) {
            let (name, state) = state_of(&source);
            self.summary(&name, suppressed, state.as_deref());
        }
    }

    fn summary(&self, name: &str, suppressed: u64, state: Option<&str>) {
        let component = self.component.as_str();
        match state {
            Some(state) => tracing::warn!(
                component,
                source = %name,
                suppressed,
                "{suppressed} repeated state-change lines of {name} were not logged (bch_log_lines_suppressed_total); it is now {state}"
            ),
            None => tracing::warn!(
                component,
                source = %name,
                suppressed,
                "{suppressed} repeated state-change lines of {name} were not logged (bch_log_lines_suppressed_total)"
            ),
        }
    }
}

/// A component whose state-change lines are limited: the `component` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// DNS discovery, per source.
    Discovery,
    /// The load scraper, per worker.
    Scraper,
    /// The health prober, per worker.
    Prober,
    /// The endpoint picker: warnings about what a peer on the picker port claims, which any
    /// peer can repeat at will (one source for all of them).
    Picker,
}

impl LabelValue for Component {
    const ALL: &'static [Self] = &[
        Component::Discovery,
        Component::Scraper,
        Component::Prober,
        Component::Picker,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn as_str(self) -> &'static str {
        match self {
            Component::Discovery => "discovery",
            Component::Scraper => "scraper",
            Component::Prober => "prober",
            Component::Picker => "picker",
        }
    }
}

/// Lines suppressed by every limiter, by component, for `/metrics`
/// (`bch_log_lines_suppressed_total{component}`).
#[derive(Debug, Default)]
pub struct SuppressedLines {
    /// By [`LabelValue::index`] of the four components.
    counts: [AtomicU64; 4],
}

impl SuppressedLines {
    /// Counts one line `component` did not log.
    pub fn record(&self, component: Component) {
        self.counts[component.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Lines `component` did not log so far.
    pub fn count(&self, component: Component) -> u64 {
        self.counts[component.index()].load(Ordering::Relaxed)
    }

    /// Registers `bch_log_lines_suppressed_total` in `registry`.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(SuppressedCollector(Arc::clone(self))));
    }
}

#[derive(Debug)]
struct SuppressedCollector(Arc<SuppressedLines>);

impl Collector for SuppressedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        counter(
            &mut encoder,
            "bch_log_lines_suppressed",
            "Repeated state-change log lines not written because their source (a discovery source, a worker, the picker's peers) had used up its budget of [log] state_change_lines per state_change_period_ms",
            by_label("component", |component: Component| self.0.count(component)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limiter() -> LogLimiter<&'static str> {
        LogLimiter::new(LineBudget {
            lines: 3,
            period: ms(1_000),
        })
    }

    #[test]
    fn a_source_logs_its_budget_then_is_silent_until_the_period_ends() {
        let t0 = Instant::now();
        let mut limiter = limiter();
        let admitted: Vec<Admit> = (0..10)
            .map(|i| limiter.admit(&"a", t0 + ms(i * 50)))
            .collect();
        assert_eq!(&admitted[..3], [Admit::Log { suppressed: 0 }; 3]);
        assert_eq!(&admitted[3..], [Admit::Suppress; 7]);
        // Another source has a budget of its own.
        assert_eq!(
            limiter.admit(&"b", t0 + ms(500)),
            Admit::Log { suppressed: 0 }
        );
        // The next period's first line carries the count of the dropped ones.
        assert_eq!(
            limiter.admit(&"a", t0 + ms(1_000)),
            Admit::Log { suppressed: 7 }
        );
        assert_eq!(
            limiter.admit(&"a", t0 + ms(1_001)),
            Admit::Log { suppressed: 0 }
        );
    }

    #[test]
    fn a_flood_over_many_periods_logs_a_bounded_number_of_lines_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut limiter = limiter();
        let (mut logged, mut suppressed, mut reported) = (0u64, 0u64, 0u64);
        // A change every 100 ms for 40 s: 400 lines wanted over 40 periods.
        for i in 0..400 {
            let now = t0 + ms(i * 100);
            match limiter.admit(&"flapping", now) {
                Admit::Log { suppressed: n } => {
                    logged += 1;
                    reported += n;
                }
                Admit::Suppress => suppressed += 1,
            }
            reported += limiter.flush(now).iter().map(|(_, n)| n).sum::<u64>();
        }
        assert_eq!(logged, 3 * 40, "three lines per period");
        assert_eq!(logged + suppressed, 400, "every line is logged or counted");
        reported += limiter
            .flush(t0 + ms(41_000))
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>();
        assert_eq!(
            reported, suppressed,
            "every suppressed line is reported once"
        );
    }

    #[test]
    fn flush_reports_a_source_that_went_quiet_once_its_period_ends() {
        let t0 = Instant::now();
        let mut limiter = limiter();
        for i in 0..5 {
            limiter.admit(&"a", t0 + ms(i));
        }
        assert_eq!(limiter.flush(t0 + ms(999)), [], "the period is not over");
        assert_eq!(limiter.flush(t0 + ms(1_000)), [("a", 2)]);
        assert_eq!(limiter.flush(t0 + ms(5_000)), [], "reported once");
        assert!(limiter.sources.is_empty(), "quiet sources are forgotten");
        assert_eq!(
            limiter.admit(&"a", t0 + ms(5_001)),
            Admit::Log { suppressed: 0 }
        );
    }

    #[test]
    fn a_budget_of_zero_lines_still_logs_one() {
        let t0 = Instant::now();
        let mut limiter = LogLimiter::new(LineBudget {
            lines: 0,
            period: ms(1_000),
        });
        assert_eq!(limiter.admit(&"a", t0), Admit::Log { suppressed: 0 });
        assert_eq!(limiter.admit(&"a", t0), Admit::Suppress);
    }
}
