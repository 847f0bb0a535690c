//! The live router: an immutable [`RoutingTable`] (ring + workers + health + policy) swapped
//! atomically, and the selection step that decides and takes load in one go.
//!
//! Readers never lock the table: they load an `Arc` from an [`ArcSwap`]. Writers (membership, health,
//! policy changes — rare, off the data path) build a new table and swap it in; only a membership or
//! `virtual_nodes` change rebuilds the ring, health and threshold changes reuse the same `Arc<Ring>`.
//!
//! Selection and the load increment are one atomic step with respect to other selections: a short
//! `std::sync::Mutex` serialises them, so a burst of same-key requests sees each other's load (the
//! 6:2 burst vectors depend on it). The lock is held only for the pure, allocation-free decision and
//! one atomic increment — never across an `.await` or I/O — so no slow task can hold it. Releasing
//! load (guard drop) takes no lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use arc_swap::ArcSwap;

use crate::decide::{Decision, FleetView, decide};
use crate::fleet_load::{LoadSignal, LoadSource};
use crate::load::{LoadGuard, WorkerStats};
use crate::policy::{Branch, PolicyError, PolicyPatch, PolicySettings};
use crate::ring::Ring;
use crate::routing_key::RoutingKey;
pub use crate::telemetry::WorkerSource;
use crate::telemetry::WorkerState;

/// A worker as configured: unique `name` and `url`, and the identity its ring points are labelled
/// with (`ring_id`, defaulting to the URL exactly as written, which is what gives placement parity
/// with SGLang Model Gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Unique name, shown in headers, metrics and telemetry.
    pub name: String,
    /// Base URL, e.g. `http://10.0.0.7:8000`.
    pub url: String,
    /// Ring identity override; `None` means the URL.
    pub ring_id: Option<String>,
    /// Where the worker came from (configured or discovered); shown, never routed on.
    pub source: WorkerSource,
}

impl WorkerSpec {
    /// The identity hashed onto the ring.
    pub fn ring_id(&self) -> &str {
        self.ring_id.as_deref().unwrap_or(&self.url)
    }
}

/// Why a membership change was refused; the running table is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// Two workers with one name.
    #[error("duplicate worker name {0:?}")]
    DuplicateName(String),
    /// Two workers with one URL.
    #[error("duplicate worker url {0:?}")]
    DuplicateUrl(String),
    /// Two workers with one ring identity (they would share every ring point).
    #[error("duplicate worker ring_id {0:?}")]
    DuplicateRingId(String),
    /// An empty name or URL.
    #[error("worker {0} must not be empty")]
    Empty(&'static str),
    /// Removal of a worker that is not registered.
    #[error("no worker named {0:?}")]
    UnknownWorker(String),
}

/// A registered worker inside a routing table.
#[derive(Debug)]
pub struct Worker {
    /// Its name, URL and ring identity.
    pub spec: WorkerSpec,
    /// Its counters, shared with every table and guard that names it.
    pub stats: Arc<WorkerStats>,
}

/// One immutable routing snapshot. Worker indices are configuration order and match the ring.
#[derive(Debug)]
pub struct RoutingTable {
    workers: Arc<[Worker]>,
    ring: Arc<Ring>,
    healthy: Vec<bool>,
    states: Vec<WorkerState>,
    /// `healthy && active` per worker: what routing asks, computed once per table.
    routable: Vec<bool>,
    routable_count: usize,
    policy: PolicySettings,
    membership_generation: u64,
}

impl RoutingTable {
    /// Workers in configuration order.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The ring the table was built with (every registered worker, whatever its health).
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// The policy and thresholds this table routes with.
    pub fn policy(&self) -> &PolicySettings {
        &self.policy
    }

    /// Whether each worker's health checks pass, configuration order: health only, whatever the
    /// worker's state. Whether a worker takes requests is [`RoutingTable::routable`].
    pub fn healthy_flags(&self) -> &[bool] {
        &self.healthy
    }

    /// Whether `worker` takes new requests: healthy and active (not draining). The one meaning of
    /// "ready" for first picks, retries and the endpoint picker's fallbacks. `false` for an index
    /// that is no worker of the table.
    pub fn routable(&self, worker: usize) -> bool {
        self.routable.get(worker).copied().unwrap_or(false)
    }

    /// The routable workers clockwise from `position`, each once, in ring order, leaving out those
    /// `skip` names (the worker that failed, the workers already listed): where a keyed request's
    /// retry and fallbacks go. Allocation-free; see [`Ring::workers_clockwise`].
    pub fn routable_from<'a>(
        &'a self,
        position: u64,
        skip: impl Fn(usize) -> bool + 'a,
    ) -> impl Iterator<Item = usize> + 'a {
        self.ring
            .workers_clockwise(position, move |w| self.routable[w] && !skip(w))
    }

    /// The routable worker with the fewest requests in flight, leaving out those `skip` names:
    /// where a keyless request's retry and fallbacks go. Ties go to the lower index. `None` when
    /// every routable worker is skipped.
    pub fn least_loaded_routable(&self, skip: impl Fn(usize) -> bool) -> Option<usize> {
        (0..self.workers.len())
            .filter(|&w| self.routable[w] && !skip(w))
            .min_by_key(|&w| self.workers[w].stats.active())
    }

    /// Each worker's operator state (`active` or `draining`), configuration order.
    pub fn states(&self) -> &[WorkerState] {
        &self.states
    }

    /// Workers that take new requests: healthy and not draining. `/readiness` counts these.
    pub fn routable_count(&self) -> usize {
        self.routable_count
    }

    /// Increases by one on every membership (or `virtual_nodes`) change: a cheap way for observers
    /// to notice the ring changed.
    pub fn membership_generation(&self) -> u64 {
        self.membership_generation
    }

    /// Index of the worker called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.workers.iter().position(|w| w.spec.name == name)
    }

    /// Every worker's record (configuration order), the shape of `GET /admin/workers` and of the
    /// telemetry worker records, with scrape ages taken at `now_ms` (wall clock, ms since the Unix
    /// epoch).
    pub fn worker_records(&self, now_ms: u64) -> Vec<crate::telemetry::WorkerRecord> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let last = w.stats.fleet_sample().last();
                let metrics_mode = self.policy.load_source == LoadSource::WorkerMetrics;
                crate::telemetry::WorkerRecord {
                    name: w.spec.name.clone(),
                    url: w.spec.url.clone(),
                    healthy: self.healthy[i],
                    state: self.states[i],
                    active: w.stats.active(),
                    requests_total: w.stats.requests_total(),
                    spilled_in_total: w.stats.spilled_in_total(),
                    spilled_out_total: w.stats.spilled_out_total(),
                    errors_total: w.stats.errors_total(),
                    load: Some(self.load(i)),
                    reported_load: last.map(|l| l.sample.reported),
                    scrape_age_ms: last.map(|l| now_ms.saturating_sub(l.scraped_at_ms)),
                    load_stale: metrics_mode && !last.is_some_and(|l| l.fresh),
                    source: w.spec.source.clone(),
                }
            })
            .collect()
    }

    /// What a key would get right now, without taking load (for `/admin/explain`).
    pub fn explain(&self, key: &RoutingKey<'_>) -> Decision {
        decide(&self.ring, &self.policy, key, self, 0, 0)
    }
}

impl FleetView for RoutingTable {
    fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Healthy and not draining: a draining worker's keys go where an unhealthy worker's would.
    fn healthy(&self, worker: usize) -> bool {
        self.routable[worker]
    }

    fn healthy_count(&self) -> usize {
        self.routable_count
    }

    fn load(&self, worker: usize) -> u64 {
        self.load_with_signal(worker).0
    }

    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        let stats = &self.workers[worker].stats;
        let local = stats.active();
        match self.policy.load_source {
            LoadSource::Local => (local, LoadSignal::Local),
            LoadSource::WorkerMetrics => match stats.fleet_sample().fresh() {
                Some(sample) => (sample.load(local), LoadSignal::WorkerMetrics),
                None => (local, LoadSignal::Local),
            },
        }
    }

    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        resolve_target(self.workers.iter().map(|w| &w.spec), raw)
    }
}

/// Target worker header resolution shared by the live table and `explain`: name, else exact URL,
/// else decimal 0-based index in configuration order.
pub fn resolve_target<'a>(
    specs: impl Iterator<Item = &'a WorkerSpec> + Clone,
    raw: &[u8],
) -> Option<usize> {
    let text = std::str::from_utf8(raw).ok()?;
    specs
        .clone()
        .position(|s| s.name == text)
        .or_else(|| specs.clone().position(|s| s.url == text))
        .or_else(|| {
            let index: usize = text.parse().ok()?;
            (index < specs.count()).then_some(index)
        })
}

/// A routed request: the table it was decided on, the decision, and the load guard when a worker
/// was chosen. Keep the guard alive until the response body ends.
#[derive(Debug)]
pub struct Routed {
    /// Snapshot the decision used (resolve `decision.worker` against it).
    pub table: Arc<RoutingTable>,
    /// Where the request goes and why.
    pub decision: Decision,
    /// Load on the chosen worker; `None` when no worker was chosen.
    pub guard: Option<LoadGuard>,
}

/// Membership bookkeeping, touched only by writers.
#[derive(Debug, Default)]
struct CounterRegistry {
    /// Counters by worker URL, kept weakly: a removed worker's counters live on while its guards do
    /// (or while anyone else holds its `Arc<WorkerStats>`), and a re-added worker with the same URL
    /// picks them up again. The router itself never decides how long a departed worker is
    /// remembered: a caller that wants counters to survive an absence holds the `Arc`.
    counters: HashMap<String, Weak<WorkerStats>>,
    /// New workers start unhealthy (until a probe passes) instead of healthy.
    new_workers_unhealthy: bool,
}

/// The router: current table plus the selection step.
#[derive(Debug)]
pub struct Router {
    table: ArcSwap<RoutingTable>,
    select: Mutex<()>,
    writer: Mutex<CounterRegistry>,
    turn: AtomicU64,
    entropy: AtomicU64,
}

impl Router {
    /// A router over `workers` (all healthy at start) with `policy`.
    pub fn new(workers: Vec<WorkerSpec>, policy: PolicySettings) -> Result<Router, RouterError> {
        Router::with_initial_health(workers, policy, true)
    }

    /// A router over `workers` with `policy`, where every worker, at start and when added later,
    /// begins `healthy` or not (a gateway that waits for a worker's first probe before sending it
    /// traffic starts them unhealthy).
    pub fn with_initial_health(
        workers: Vec<WorkerSpec>,
        policy: PolicySettings,
        healthy: bool,
    ) -> Result<Router, RouterError> {
        policy.validate()?;
        validate_membership(&workers)?;
        let mut registry = CounterRegistry {
            new_workers_unhealthy: !healthy,
            ..CounterRegistry::default()
        };
        let table = build_table(&mut registry, workers, policy, None, 0);
        Ok(Router {
            table: ArcSwap::from_pointee(table),
            select: Mutex::new(()),
            writer: Mutex::new(registry),
            turn: AtomicU64::new(0),
            entropy: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        })
    }

    /// The table in force now: one lock-free load (an `Arc` clone).
    pub fn table(&self) -> Arc<RoutingTable> {
        self.table.load_full()
    }

    /// Decides and takes load on the chosen worker, as one step relative to other selections.
    pub fn route(&self, key: &RoutingKey<'_>) -> Routed {
        let table = self.table.load_full();
        let entropy = self.next_entropy();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let (decision, guard) = {
            let _selection = self.select.lock().unwrap_or_else(PoisonError::into_inner);
            let decision = decide(&table.ring, &table.policy, key, &*table, entropy, turn);
            let guard = decision.worker.map(|w| table.workers[w].stats.acquire());
            (decision, guard)
        };
        if decision.branch == Branch::ExplicitRoutingKeySpillover
            && let (Some(from), Some(to)) = (decision.preferred, decision.worker)
        {
            table.workers[from].stats.record_spill_out();
            table.workers[to].stats.record_spill_in();
        }
        Routed {
            table,
            decision,
            guard,
        }
    }

    /// The retry pick after a connection to `failed` could not be made: the next routable worker
    /// clockwise from the key (skipping `failed`), or for keyless requests the least loaded other
    /// routable worker. Takes load like [`Router::route`]. `None` when no other routable worker
    /// exists.
    pub fn route_retry(
        &self,
        table: &Arc<RoutingTable>,
        key: &RoutingKey<'_>,
        failed: usize,
    ) -> Option<(usize, LoadGuard)> {
        let _selection = self.select.lock().unwrap_or_else(PoisonError::into_inner);
        let next = match key.position() {
            Some(position) => table.routable_from(position, |w| w == failed).next(),
            None => table.least_loaded_routable(|w| w == failed),
        }?;
        Some((next, table.workers[next].stats.acquire()))
    }

    /// Takes load on `worker` of `table`, a worker chosen outside the router: the fallback an
    /// external proxy (Envoy, with gatewayd as its endpoint picker) served a request from after
    /// the chosen worker failed. An increment inside the selection step like every other, so
    /// concurrent selections see it. `None` when `worker` is not an index of `table`.
    pub fn reserve(&self, table: &RoutingTable, worker: usize) -> Option<LoadGuard> {
        let stats = &table.workers.get(worker)?.stats;
        let _selection = self.select.lock().unwrap_or_else(PoisonError::into_inner);
        Some(stats.acquire())
    }

    /// Marks a worker healthy or unhealthy by name. Reuses the ring. Returns `true` if the health
    /// changed, `false` if it was already so or the worker is unknown.
    pub fn set_health(&self, name: &str, healthy: bool) -> bool {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let Some(index) = current.index_of(name) else {
            return false;
        };
        if current.healthy[index] == healthy {
            return false;
        }
        let mut health = current.healthy.clone();
        health[index] = healthy;
        current.workers[index].stats.record_health_change();
        self.table.store(Arc::new(current.with_flags(
            health,
            current.states.clone(),
            current.policy,
        )));
        true
    }

    /// Sets a worker's operator state by name (`draining` takes it out of routing like an
    /// unhealthy worker, without touching its health). Reuses the ring. `None` when no worker has
    /// this name; otherwise whether the state changed.
    pub fn set_state(&self, name: &str, state: WorkerState) -> Option<bool> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let index = current.index_of(name)?;
        if current.states[index] == state {
            return Some(false);
        }
        let mut states = current.states.clone();
        states[index] = state;
        self.table.store(Arc::new(current.with_flags(
            current.healthy.clone(),
            states,
            current.policy,
        )));
        Some(true)
    }

    /// Applies a policy patch atomically; a refused patch changes nothing. Thresholds and kind reuse
    /// the ring; a new `virtual_nodes` rebuilds it.
    pub fn set_policy(&self, patch: &PolicyPatch) -> Result<PolicySettings, PolicyError> {
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let policy = current.policy.patched(patch)?;
        let table = if policy.virtual_nodes != current.policy.virtual_nodes {
            let specs = current.workers.iter().map(|w| w.spec.clone()).collect();
            build_table(
                &mut registry,
                specs,
                policy,
                Some(&current),
                current.membership_generation + 1,
            )
        } else {
            current.with_flags(current.healthy.clone(), current.states.clone(), policy)
        };
        self.table.store(Arc::new(table));
        Ok(policy)
    }

    /// Whether workers that join from now on start healthy (see [`Router::with_initial_health`]).
    pub fn set_initial_health(&self, healthy: bool) {
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        registry.new_workers_unhealthy = !healthy;
    }

    /// Adds a worker (active, and healthy unless new workers start unhealthy). Rebuilds the ring.
    pub fn add_worker(&self, spec: WorkerSpec) -> Result<(), MembershipError> {
        self.change_membership(|specs| {
            specs.push(spec);
            Ok(())
        })
    }

    /// Removes the worker called `name` and returns its spec. Requests already routed to it keep
    /// their guards; no new request is routed to it once this returns.
    pub fn remove_worker(&self, name: &str) -> Result<WorkerSpec, MembershipError> {
        let mut removed = None;
        self.change_membership(|specs| {
            let index = specs
                .iter()
                .position(|s| s.name == name)
                .ok_or_else(|| MembershipError::UnknownWorker(name.to_owned()))?;
            removed = Some(specs.remove(index));
            Ok(())
        })?;
        Ok(removed.expect("set on success"))
    }

    /// Replaces the worker list and the whole policy in one swap (configuration reload): readers see
    /// either the old table or the new one, never new workers with the old thresholds. Both are
    /// validated first; on error nothing changes. Workers that stay keep their counters and health.
    pub fn reconfigure(
        &self,
        workers: Vec<WorkerSpec>,
        policy: PolicySettings,
    ) -> Result<(), RouterError> {
        policy.validate()?;
        validate_membership(&workers)?;
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let table = build_table(
            &mut registry,
            workers,
            policy,
            Some(&current),
            current.membership_generation + 1,
        );
        self.table.store(Arc::new(table));
        Ok(())
    }

    fn change_membership(
        &self,
        edit: impl FnOnce(&mut Vec<WorkerSpec>) -> Result<(), MembershipError>,
    ) -> Result<(), MembershipError> {
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let mut specs: Vec<WorkerSpec> = current.workers.iter().map(|w| w.spec.clone()).collect();
        edit(&mut specs)?;
        validate_membership(&specs)?;
        let table = build_table(
            &mut registry,
            specs,
            current.policy,
            Some(&current),
            current.membership_generation + 1,
        );
        self.table.store(Arc::new(table));
        Ok(())
    }

    /// SplitMix64 over an atomic state: cheap, lock-free, good enough for load-balancing picks (no
    /// security role).
    fn next_entropy(&self) -> u64 {
        let mut z = self
            .entropy
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Errors from [`Router::new`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouterError {
    /// The policy settings are out of range.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The worker list breaks a uniqueness rule or has an empty field.
    #[error(transparent)]
    Membership(#[from] MembershipError),
}

/// Checks a worker list the way every membership change does: no empty name or URL, and no two
/// workers sharing a name, a URL or a ring identity. A caller that must prepare for a change (open
/// connection pools, say) before the router takes it checks first with this.
pub fn validate_membership(specs: &[WorkerSpec]) -> Result<(), MembershipError> {
    let mut names = std::collections::HashSet::new();
    let mut urls = std::collections::HashSet::new();
    let mut ring_ids = std::collections::HashSet::new();
    for spec in specs {
        if spec.name.is_empty() {
            return Err(MembershipError::Empty("name"));
        }
        if spec.url.is_empty() {
            return Err(MembershipError::Empty("url"));
        }
        if !names.insert(spec.name.as_str()) {
            return Err(MembershipError::DuplicateName(spec.name.clone()));
        }
        if !urls.insert(spec.url.as_str()) {
            return Err(MembershipError::DuplicateUrl(spec.url.clone()));
        }
        if !ring_ids.insert(spec.ring_id()) {
            return Err(MembershipError::DuplicateRingId(spec.ring_id().to_owned()));
        }
    }
    Ok(())
}

impl RoutingTable {
    /// The same membership and ring (shared, not rebuilt) with other health, states or policy:
    /// what a health flip, a drain or a threshold change publishes.
    fn with_flags(
        &self,
        healthy: Vec<bool>,
        states: Vec<WorkerState>,
        policy: PolicySettings,
    ) -> RoutingTable {
        RoutingTable::assemble(
            Arc::clone(&self.workers),
            Arc::clone(&self.ring),
            healthy,
            states,
            policy,
            self.membership_generation,
        )
    }

    fn assemble(
        workers: Arc<[Worker]>,
        ring: Arc<Ring>,
        healthy: Vec<bool>,
        states: Vec<WorkerState>,
        policy: PolicySettings,
        membership_generation: u64,
    ) -> RoutingTable {
        let routable: Vec<bool> = healthy
            .iter()
            .zip(&states)
            .map(|(h, s)| *h && *s == WorkerState::Active)
            .collect();
        RoutingTable {
            workers,
            ring,
            healthy,
            states,
            routable_count: routable.iter().filter(|r| **r).count(),
            routable,
            policy,
            membership_generation,
        }
    }
}

fn build_table(
    registry: &mut CounterRegistry,
    specs: Vec<WorkerSpec>,
    policy: PolicySettings,
    previous: Option<&RoutingTable>,
    membership_generation: u64,
) -> RoutingTable {
    registry.counters.retain(|_, weak| weak.strong_count() > 0);
    let initial_health = !registry.new_workers_unhealthy;
    let ring_ids: Vec<&str> = specs.iter().map(WorkerSpec::ring_id).collect();
    let ring = Arc::new(Ring::build(&ring_ids, policy.virtual_nodes));
    // A worker that stays (same URL) keeps its health and state; a new one starts active, with the
    // initial health.
    let kept = |spec: &WorkerSpec| {
        let table = previous?;
        let i = table.workers.iter().position(|w| w.spec.url == spec.url)?;
        Some((table.healthy[i], table.states[i]))
    };
    let (healthy, states): (Vec<bool>, Vec<WorkerState>) = specs
        .iter()
        .map(|spec| kept(spec).unwrap_or((initial_health, WorkerState::Active)))
        .unzip();
    let workers: Arc<[Worker]> = specs
        .into_iter()
        .map(|spec| {
            let stats = registry
                .counters
                .get(&spec.url)
                .and_then(Weak::upgrade)
                .unwrap_or_else(|| {
                    let stats = Arc::new(WorkerStats::default());
                    registry
                        .counters
                        .insert(spec.url.clone(), Arc::downgrade(&stats));
                    stats
                });
            Worker { spec, stats }
        })
        .collect();
    RoutingTable::assemble(
        workers,
        ring,
        healthy,
        states,
        policy,
        membership_generation,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing_key::ExplicitKey;

    fn spec(n: u16) -> WorkerSpec {
        WorkerSpec {
            name: format!("w{n}"),
            url: format!("http://127.0.0.1:{}", 30000 + n),
            ring_id: None,
            source: WorkerSource::Static,
        }
    }

    #[test]
    fn health_and_threshold_changes_reuse_the_ring() {
        let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
        let before = Arc::clone(router.table().ring());
        assert!(router.set_health("w1", false));
        assert!(!router.set_health("w1", false));
        router
            .set_policy(&PolicyPatch {
                min_load_gap: Some(7),
                ..Default::default()
            })
            .unwrap();
        let after = router.table();
        assert!(Arc::ptr_eq(&before, after.ring()));
        assert_eq!(after.policy().min_load_gap, 7);
        assert_eq!(after.healthy_flags(), &[false, true]);
        router
            .set_policy(&PolicyPatch {
                virtual_nodes: Some(10),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(router.table().ring().len(), 20);
        assert_eq!(
            router.table().healthy_flags(),
            &[false, true],
            "health survives a rebuild"
        );
    }

    #[test]
    fn refused_changes_leave_the_table_alone() {
        let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
        let before = router.table();
        assert!(
            router
                .set_policy(&PolicyPatch {
                    max_load_skew: Some(0.5),
                    ..Default::default()
                })
                .is_err()
        );
        assert_eq!(
            router.add_worker(WorkerSpec {
                name: "w1".into(),
                url: "http://other".into(),
                ring_id: None,
                source: WorkerSource::Static,
            }),
            Err(MembershipError::DuplicateName("w1".into()))
        );
        assert_eq!(
            router.remove_worker("nope"),
            Err(MembershipError::UnknownWorker("nope".into()))
        );
        assert!(Arc::ptr_eq(&before, &router.table()));
    }

    #[test]
    fn reserve_takes_load_on_the_named_worker_until_the_guard_drops() {
        let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
        let table = router.table();
        assert!(router.reserve(&table, 2).is_none());
        let guard = router.reserve(&table, 1).unwrap();
        assert_eq!(table.workers()[1].stats.active(), 1);
        assert_eq!(table.workers()[1].stats.requests_total(), 1);
        assert_eq!(table.workers()[0].stats.active(), 0);
        drop(guard);
        assert_eq!(table.workers()[1].stats.active(), 0);
    }

    #[test]
    fn counters_survive_remove_and_re_add() {
        let router = Router::new(vec![spec(1)], PolicySettings::default()).unwrap();
        let key = ExplicitKey::parse(b"k").unwrap();
        let routed = router.route(&RoutingKey::Explicit(key));
        assert_eq!(routed.decision.worker, Some(0));
        router.remove_worker("w1").unwrap();
        assert_eq!(
            router.route(&RoutingKey::Explicit(key)).decision.branch,
            Branch::NoHealthyWorkers
        );
        router.add_worker(spec(1)).unwrap();
        assert_eq!(router.table().workers()[0].stats.active(), 1);
        drop(routed);
        assert_eq!(router.table().workers()[0].stats.active(), 0);
    }

    #[test]
    fn a_held_stats_arc_keeps_a_departed_workers_counters_for_its_return() {
        let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
        let key = RoutingKey::Explicit(ExplicitKey::parse(b"k").unwrap());
        drop(router.route(&key));
        let table = router.table();
        let kept = Arc::clone(&table.workers()[0].stats);
        let forgotten_total = table.workers()[1].stats.requests_total();
        drop(table);
        router.remove_worker("w1").unwrap();
        router.remove_worker("w2").unwrap();
        router
            .reconfigure(vec![spec(2), spec(1)], PolicySettings::default())
            .unwrap();
        let table = router.table();
        assert!(
            Arc::ptr_eq(&kept, &table.workers()[1].stats),
            "w1 gets its counters back"
        );
        assert_eq!(
            table.workers()[0].stats.requests_total(),
            0,
            "nobody held w2's"
        );
        assert_eq!(kept.requests_total() + forgotten_total, 1);
    }

    #[test]
    fn reconfigure_swaps_workers_and_policy_together_or_not_at_all() {
        let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
        router.set_health("w2", false);
        let before = router.table();
        let bad = PolicySettings {
            max_load_skew: 0.5,
            ..Default::default()
        };
        assert!(router.reconfigure(vec![spec(2), spec(3)], bad).is_err());
        assert!(Arc::ptr_eq(&before, &router.table()));
        let good = PolicySettings {
            min_load_gap: 9,
            ..Default::default()
        };
        router.reconfigure(vec![spec(2), spec(3)], good).unwrap();
        let after = router.table();
        assert_eq!(after.policy().min_load_gap, 9);
        let names: Vec<_> = after
            .workers()
            .iter()
            .map(|w| w.spec.name.as_str())
            .collect();
        assert_eq!(names, ["w2", "w3"]);
        assert_eq!(after.healthy_flags(), &[false, true], "w2 keeps its health");
        assert_eq!(
            after.membership_generation(),
            before.membership_generation() + 1
        );
    }

    #[test]
    fn a_draining_worker_gets_no_new_requests_and_keeps_its_health_and_state() {
        let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
        let key = ExplicitKey::parse(b"session").unwrap();
        let preferred = router.route(&RoutingKey::Explicit(key)).decision.worker;
        let home = preferred.unwrap();
        let name = router.table().workers()[home].spec.name.clone();
        assert_eq!(router.set_state(&name, WorkerState::Draining), Some(true));
        assert_eq!(router.set_state(&name, WorkerState::Draining), Some(false));
        assert_eq!(router.set_state("nope", WorkerState::Draining), None);
        let table = router.table();
        assert_eq!(table.healthy_flags(), &[true, true], "health untouched");
        assert_eq!(table.routable_count(), 1);
        let routed = router.route(&RoutingKey::Explicit(key));
        assert_eq!(
            routed.decision.worker,
            Some(1 - home),
            "where an unhealthy worker's go"
        );
        let target = router.route(&RoutingKey::Target(name.as_bytes()));
        assert_eq!(target.decision.branch, Branch::TargetWorkerMiss);
        assert!(
            router
                .route_retry(&table, &RoutingKey::None, 1 - home)
                .is_none(),
            "a retry never lands on it either"
        );
        // Kept across a membership change (a reload of the same workers), like health.
        router
            .reconfigure(vec![spec(1), spec(2)], PolicySettings::default())
            .unwrap();
        let table = router.table();
        assert_eq!(table.states()[home], WorkerState::Draining);
        assert_eq!(table.worker_records(0)[home].state, WorkerState::Draining);
        router.set_state(&name, WorkerState::Active);
        let back = router.route(&RoutingKey::Explicit(key)).decision.worker;
        assert_eq!(back, preferred, "undrained, the key comes home");
    }

    #[test]
    fn new_workers_can_start_unhealthy_and_health_flips_are_counted() {
        let router =
            Router::with_initial_health(vec![spec(1)], PolicySettings::default(), false).unwrap();
        assert_eq!(router.table().healthy_flags(), &[false]);
        assert_eq!(
            router.route(&RoutingKey::None).decision.branch,
            Branch::NoHealthyWorkers
        );
        assert!(router.set_health("w1", true));
        router.add_worker(spec(2)).unwrap();
        assert_eq!(
            router.table().healthy_flags(),
            &[true, false],
            "only the new one waits"
        );
        router.set_initial_health(true);
        router.add_worker(spec(3)).unwrap();
        assert_eq!(router.table().healthy_flags(), &[true, false, true]);
        router.set_health("w1", false);
        router.set_health("w1", false);
        assert_eq!(router.table().workers()[0].stats.health_changes_total(), 2);
    }

    #[test]
    fn the_walk_yields_routable_workers_once_in_ring_order_without_the_skipped() {
        let router = Router::new((1..=5).map(spec).collect(), PolicySettings::default()).unwrap();
        router.set_health("w2", false);
        router.set_state("w4", WorkerState::Draining);
        let table = router.table();
        assert_eq!(table.healthy_flags(), &[true, false, true, true, true]);
        assert!(table.routable(0) && !table.routable(1) && !table.routable(3));
        assert!(!table.routable(5), "no such worker");
        let position = crate::ring::hash_position(b"key");
        let expected: Vec<usize> = table
            .ring()
            .workers_from(position)
            .into_iter()
            .filter(|&w| ![1, 3, 4].contains(&w))
            .collect();
        let walk: Vec<usize> = table.routable_from(position, |w| w == 4).collect();
        assert_eq!(walk, expected);
        assert_eq!(expected.len(), 2);
        assert_eq!(
            router
                .route_retry(
                    &table,
                    &RoutingKey::Explicit(ExplicitKey::parse(b"key").unwrap()),
                    4
                )
                .map(|(w, _)| w),
            expected.first().copied(),
            "a retry takes the walk's first"
        );
    }

    #[test]
    fn keyless_fallbacks_go_to_the_least_loaded_routable_worker() {
        let router = Router::new((1..=4).map(spec).collect(), PolicySettings::default()).unwrap();
        router.set_state("w1", WorkerState::Draining);
        let table = router.table();
        let _held = [
            router.reserve(&table, 1),
            router.reserve(&table, 1),
            router.reserve(&table, 2),
        ];
        assert_eq!(table.least_loaded_routable(|_| false), Some(3));
        assert_eq!(table.least_loaded_routable(|w| w == 3), Some(2));
        assert_eq!(table.least_loaded_routable(|w| w != 0), None, "w1 drains");
        assert_eq!(
            router
                .route_retry(&table, &RoutingKey::None, 3)
                .map(|(w, _)| w),
            Some(2)
        );
    }

    proptest::proptest! {
        #[test]
        fn the_walk_yields_only_routable_workers_each_once_in_ring_order(
            workers in 1u16..12,
            virtual_nodes in 1u32..40,
            flags in proptest::collection::vec((proptest::bool::ANY, proptest::bool::ANY), 12),
            skipped in proptest::collection::vec(proptest::bool::ANY, 12),
            position in proptest::num::u64::ANY,
        ) {
            let policy = PolicySettings { virtual_nodes, ..PolicySettings::default() };
            let router = Router::new((0..workers).map(spec).collect(), policy).unwrap();
            for (w, (healthy, draining)) in flags.iter().take(usize::from(workers)).enumerate() {
                let name = format!("w{w}");
                router.set_health(&name, *healthy);
                if *draining {
                    router.set_state(&name, WorkerState::Draining);
                }
            }
            let table = router.table();
            let walk: Vec<usize> = table.routable_from(position, |w| skipped[w]).collect();
            for &w in &walk {
                proptest::prop_assert!(table.healthy_flags()[w]);
                proptest::prop_assert_eq!(table.states()[w], WorkerState::Active);
                proptest::prop_assert!(!skipped[w]);
            }
            // Ring order, each once: the walk is the first-point order of the turn, filtered.
            let mut seen = vec![false; usize::from(workers)];
            let reference: Vec<usize> = table
                .ring()
                .points_from(position)
                .filter(|&w| !std::mem::replace(&mut seen[w], true))
                .filter(|&w| table.routable(w) && !skipped[w])
                .collect();
            proptest::prop_assert_eq!(walk, reference);
        }
    }

    #[test]
    fn target_resolution_order() {
        let specs = [
            WorkerSpec {
                name: "1".into(),
                url: "http://a".into(),
                ring_id: None,
                source: WorkerSource::Static,
            },
            WorkerSpec {
                name: "b".into(),
                url: "http://b".into(),
                ring_id: None,
                source: WorkerSource::Static,
            },
        ];
        assert_eq!(
            resolve_target(specs.iter(), b"1"),
            Some(0),
            "name before index"
        );
        assert_eq!(resolve_target(specs.iter(), b"http://b"), Some(1));
        assert_eq!(resolve_target(specs.iter(), b"0"), Some(0));
        assert_eq!(resolve_target(specs.iter(), b"2"), None);
        assert_eq!(resolve_target(specs.iter(), b"\xff"), None);
    }
}
