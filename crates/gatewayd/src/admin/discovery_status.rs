//! Each discovery source's health, as its task reports it after every resolution: what
//! `GET /admin/discovery` answers and what telemetry carries to consoles.
//!
//! The admin owner keeps it because it already owns each source's set and the list of sources in
//! force; the board has its own lock, never held with the membership's for long, and never taken
//! by the data path.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use bch_core::router::WorkerSource;
use bch_core::telemetry::{DiscoveryKind, DiscoverySource, DiscoveryState};

use super::Admin;
use crate::config::{DiscoveryConfig, DnsKind};

/// What one resolution gave, as the health board sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolutionOutcome {
    /// Workers; `lookup_error` when one address family's lookup failed while the other answered.
    Workers {
        /// The failed lookup, described (`NAME AAAA: response code Refused`).
        lookup_error: Option<String>,
    },
    /// An empty answer; why.
    Empty(String),
    /// A failed resolution; why.
    Failed(String),
}

/// A source's state changed: `from` → `to`, with the reason of a failing or empty state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// The state before this resolution.
    pub from: DiscoveryState,
    /// The state now.
    pub to: DiscoveryState,
    /// Why, for `failing` and `empty`.
    pub reason: Option<String>,
}

/// One source's remembered health.
#[derive(Debug, Clone)]
struct Health {
    state: DiscoveryState,
    last_error: Option<(String, u64)>,
    last_good_ms: Option<u64>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: DiscoveryState::Pending,
            last_error: None,
            last_good_ms: None,
        }
    }
}

/// Every source's health by canonical name. Sources a reload removed stay here unlisted (the
/// list follows the configuration in force) until a source of that name starts again.
#[derive(Debug, Default)]
pub struct HealthBoard {
    sources: Mutex<BTreeMap<String, Health>>,
}

impl HealthBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Health>> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Admin {
    /// A source's task started (at start-up, or restarted by a reload): its state is `pending`
    /// until its first resolution, whatever an earlier task of the same name reported.
    pub fn discovery_started(&self, source: &DiscoveryConfig) {
        self.health_board
            .lock()
            .insert(source.canonical_name(), Health::default());
        self.publish_discovery();
    }

    /// Records one resolution of `source` at `now_ms` (ms since the Unix epoch), after its set (if
    /// any) was applied, and tells telemetry. Answers the state change, for the task to log once.
    pub fn record_resolution(
        &self,
        source: &DiscoveryConfig,
        outcome: ResolutionOutcome,
        now_ms: u64,
    ) -> Option<StateChange> {
        let change = {
            let mut board = self.health_board.lock();
            let health = board.entry(source.canonical_name()).or_default();
            let (state, error) = match outcome {
                ResolutionOutcome::Workers { lookup_error } => {
                    health.last_good_ms = Some(now_ms);
                    (DiscoveryState::Ok, lookup_error)
                }
                ResolutionOutcome::Empty(why) => (DiscoveryState::Empty, Some(why)),
                ResolutionOutcome::Failed(why) => (DiscoveryState::Failing, Some(why)),
            };
            let reason = error.clone().filter(|_| state.is_trouble());
            if let Some(error) = error {
                health.last_error = Some((error, now_ms));
            }
            let from = std::mem::replace(&mut health.state, state);
            (from != state).then_some(StateChange {
                from,
                to: state,
                reason,
            })
        };
        self.publish_discovery();
        change
    }

    /// Every source in force, in configuration order, as seen at `now_ms` (ms since the Unix
    /// epoch).
    pub fn discovery_health(&self, now_ms: u64) -> Vec<DiscoverySource> {
        self.discovery_records()
            .into_iter()
            .map(|source| source.at(now_ms))
            .collect()
    }

    /// Every source in force, in configuration order, without ages (telemetry adds them to each
    /// frame, and compares records without them).
    fn discovery_records(&self) -> Vec<DiscoverySource> {
        let sources = self.sources.borrow().clone();
        let table = self.router.table();
        let board = self.health_board.lock();
        sources
            .iter()
            .map(|source| {
                let health = board
                    .get(&source.canonical_name())
                    .cloned()
                    .unwrap_or_default();
                let label = WorkerSource::Dns(source.dns.clone());
                let workers = table
                    .workers()
                    .iter()
                    .filter(|w| w.spec.source == label)
                    .count() as u64;
                DiscoverySource {
                    name: source.dns.clone(),
                    source: label.label().into_owned(),
                    kind: match source.kind() {
                        DnsKind::Srv => DiscoveryKind::Srv,
                        DnsKind::Address => DiscoveryKind::Address,
                    },
                    state: health.state,
                    last_error_ms: health.last_error.as_ref().map(|(_, at)| *at),
                    last_error: health.last_error.map(|(error, _)| error),
                    last_good_ms: health.last_good_ms,
                    last_good_age_ms: None,
                    workers,
                }
            })
            .collect()
    }

    /// Hands the sources' records to telemetry (which sends them on when they changed).
    pub(super) fn publish_discovery(&self) {
        self.telemetry.discovery_changed(self.discovery_records());
    }
}
