//! Each discovery source's health, as its task reports it after every resolution: what
//! `GET /admin/discovery` answers and what telemetry carries to consoles. The admin owner keeps
//! the board (`discovery_health` has its methods) because it already owns each source's set and
//! the list of sources in force; the board has its own lock, held only to read or write a few
//! fields, and never taken by the data path.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use bch_core::router::{RoutingTable, WorkerSource};
use bch_core::telemetry::{DiscoveryKind, DiscoverySource, DiscoveryState};

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
    /// `source` started (or restarted): `pending` until its first resolution, whatever an earlier
    /// task of the same name reported.
    pub fn start(&self, source: &DiscoveryConfig) {
        self.lock()
            .insert(source.canonical_name(), Health::default());
    }

    /// Records one resolution of `source` at `now_ms` (ms since the Unix epoch); answers the
    /// state change, if it was one.
    pub fn record(
        &self,
        source: &DiscoveryConfig,
        outcome: ResolutionOutcome,
        now_ms: u64,
    ) -> Option<StateChange> {
        let mut board = self.lock();
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
    }

    /// The records of `sources` (the ones in force, configuration order), their workers counted in
    /// `table`; without ages (see [`DiscoverySource::at`]).
    pub fn records(
        &self,
        sources: &[DiscoveryConfig],
        table: &RoutingTable,
    ) -> Vec<DiscoverySource> {
        let board = self.lock();
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
                        DnsKind::Srv => DiscoveryKind::Srv.into(),
                        DnsKind::Address => DiscoveryKind::Address.into(),
                    },
                    state: health.state.into(),
                    last_error_ms: health.last_error.as_ref().map(|(_, at)| *at),
                    last_error: health.last_error.map(|(error, _)| error),
                    last_good_ms: health.last_good_ms,
                    last_good_age_ms: None,
                    workers,
                }
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Health>> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
