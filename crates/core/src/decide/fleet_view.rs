//! What a decision reads about the fleet ([`FleetView`]), and the capacity part of it
//! (docs/policy.md, "Capacity"): when a worker is full, the view with only the workers that have
//! room, and the first worker with room in a key's spill order.

use crate::fleet_load::LoadSignal;
use crate::policy::{FleetLoad, SpillOrder};
use crate::ring::Ring;

/// Fleets of at most this many workers get the bitmask searches (the spill's eligible set, the
/// workers with room): one pass over the workers, then [`Ring::first_in_set`].
pub(super) const SMALL_FLEET: usize = 64;

/// What a decision needs to know about the fleet. Worker indices are positions in configuration
/// order, the same indices the [`Ring`] was built with.
pub trait FleetView {
    /// Number of registered workers.
    fn worker_count(&self) -> usize;
    /// Whether worker `worker` may receive new requests: routable, that is healthy and active (a
    /// draining worker is not), the one meaning of "ready" for every pick.
    fn routable(&self, worker: usize) -> bool;
    /// Number of routable workers.
    fn routable_count(&self) -> usize;
    /// In-flight requests on `worker`, before the request being decided: the load the rule reads
    /// under the policy's load source.
    fn load(&self, worker: usize) -> u64;
    /// [`FleetView::load`] and which signal it came from (a fresh worker sample, or local load).
    /// Views without worker samples keep the default: local.
    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        (self.load(worker), LoadSignal::Local)
    }
    /// The `n`-th routable worker in configuration order (0-based), `None` past the last. The
    /// default counts through the workers (O(n)); a view that keeps a list of its routable
    /// workers answers in O(1).
    fn nth_routable(&self, n: usize) -> Option<usize> {
        (0..self.worker_count())
            .filter(|&w| self.routable(w))
            .nth(n)
    }
    /// The minimum and mean of [`FleetView::load`] over the routable workers, when the view keeps
    /// them up to date as loads, health and membership change (then the bounded rule reads them
    /// in O(1)); they must equal [`FleetLoad::of`] over those loads exactly. `None`, the default:
    /// the rule computes them over the workers.
    fn kept_fleet_load(&self) -> Option<FleetLoad> {
        None
    }
    /// With [`FleetView::kept_fleet_load`]: the signal of the routable workers' loads, kept as
    /// they change (local when none came from a fresh sample, worker metrics when all did, mixed
    /// otherwise), exactly what folding [`LoadSignal::and`] over them gives. `None`, the default:
    /// in `worker_metrics` mode the rule then computes the minimum, mean and signal over the
    /// workers.
    fn kept_load_signal(&self) -> Option<LoadSignal> {
        None
    }
    /// Resolves a target worker header value: a worker's name, else its exact URL, else a decimal
    /// 0-based index. `None` when nothing matches.
    fn resolve_target(&self, raw: &[u8]) -> Option<usize>;
    /// Whether any worker may be full (a cap or an engine limit is set). `false`, the default,
    /// makes every decision exactly the one without capacity, without asking about it.
    fn limited(&self) -> bool {
        false
    }
    /// `worker`'s capacity in requests in flight, compared with [`FleetView::load`]; `None` = no
    /// cap (the default).
    fn capacity(&self, _worker: usize) -> Option<u64> {
        None
    }
    /// Whether `worker`'s engine reported saturation beyond the admission limits in force
    /// (`max_waiting`, `max_kv_usage`); the default: never.
    fn engine_full(&self, _worker: usize) -> bool {
        false
    }
}

/// Whether `worker` is full: its load (the one the policy reads) is at or above its capacity, or
/// its engine reported saturation. A full worker is not eligible for a new request.
pub fn is_full<F: FleetView>(fleet: &F, worker: usize) -> bool {
    fleet.engine_full(worker)
        || fleet
            .capacity(worker)
            .is_some_and(|cap| fleet.load(worker) >= cap)
}

/// A view of `fleet` in which only routable workers with room are routable: the keyless pick and
/// the baselines run on it unchanged when caps are set.
pub(super) struct WithRoom<'a, F> {
    pub(super) fleet: &'a F,
    pub(super) count: usize,
}

impl<F: FleetView> FleetView for WithRoom<'_, F> {
    fn worker_count(&self) -> usize {
        self.fleet.worker_count()
    }
    fn routable(&self, worker: usize) -> bool {
        self.fleet.routable(worker) && !is_full(self.fleet, worker)
    }
    fn routable_count(&self) -> usize {
        self.count
    }
    fn load(&self, worker: usize) -> u64 {
        self.fleet.load(worker)
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.fleet.resolve_target(raw)
    }
}

/// The first routable worker with room other than `preferred` in `order`. Asks whether each
/// worker is full at most once, and ends after one pass also when every worker is full.
pub(super) fn room_target<F: FleetView>(
    ring: &Ring,
    order: SpillOrder,
    fleet: &F,
    preferred: usize,
    position: u64,
) -> Option<usize> {
    let count = fleet.worker_count();
    let has_room = |w: usize| w != preferred && fleet.routable(w) && !is_full(fleet, w);
    if count <= SMALL_FLEET {
        let mask = (0..count)
            .filter(|&w| has_room(w))
            .fold(0u64, |mask, w| mask | 1 << w);
        return match order {
            SpillOrder::Ring => ring.first_in_set(position, mask),
            SpillOrder::HashSeeded => ring.first_seeded_in_set(position, mask),
        };
    }
    match order {
        // `workers_clockwise` yields each worker once; fullness is asked only of those.
        SpillOrder::Ring => ring
            .workers_clockwise(position, |w| w != preferred && fleet.routable(w))
            .find(|&w| !is_full(fleet, w)),
        SpillOrder::HashSeeded => ring.first_seeded(position, has_room),
    }
}
