//! Ring ownership for display: each worker's share of the hash space and its arcs, computed from a
//! [`Ring`]. gatewayd computes it from the ring it routes on (version 1 frames carry it); a
//! version 2 client computes it from the worker records, which name each worker's ring identity,
//! so both sides get it from this one function.

use super::worker::WorkerRecord;
use super::{RingOwnership, RingShare};
use crate::ring::Ring;

/// 2^64: ring positions as fractions of the hash space.
const RING_SIZE: f64 = 18_446_744_073_709_551_616.0;

impl RingOwnership {
    /// Each worker's share and arcs on `ring`; `names[i]` names the ring's worker `i` (the order
    /// the ring was built in, configuration order). Cost: one pass over the ring's points.
    ///
    /// # Panics
    /// If `names` has fewer entries than the ring has workers.
    pub fn of_ring<S: AsRef<str>>(ring: &Ring, names: &[S]) -> RingOwnership {
        let mut owned = vec![0u128; ring.worker_count()];
        let mut arcs: Vec<Vec<[f64; 2]>> = vec![Vec::new(); ring.worker_count()];
        for (owner, arc) in ring.arcs() {
            owned[owner] += arc.len();
            let start = arc.start_exclusive.map_or(0.0, |s| s as f64 / RING_SIZE);
            let end = (arc.end_inclusive as f64 / RING_SIZE).min(1.0);
            arcs[owner].push([round6(start), round6(end)]);
        }
        RingOwnership {
            virtual_nodes: ring.virtual_nodes(),
            workers: names
                .iter()
                .zip(owned)
                .zip(arcs)
                .map(|((name, owned), arcs)| RingShare {
                    name: name.as_ref().to_owned(),
                    share: owned as f64 / RING_SIZE,
                    arcs,
                })
                .collect(),
        }
    }

    /// The ownership of the ring the gateway routes on, rebuilt from its worker records (each
    /// one's [`WorkerRecord::ring_identity`]) and `virtual_nodes`: placement does not depend on
    /// the records' order, so any client holding the membership gets the gateway's ring exactly.
    /// Cost: `workers × virtual_nodes` BLAKE3 hashes and a sort (about half a second for 10,000
    /// workers × 150 in an optimised build): do it once per membership change, not per draw.
    pub fn of_workers(workers: &[WorkerRecord], virtual_nodes: u32) -> RingOwnership {
        let identities: Vec<&str> = workers.iter().map(WorkerRecord::ring_identity).collect();
        let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
        RingOwnership::of_ring(&Ring::build(&identities, virtual_nodes), &names)
    }
}

/// Fractions rounded to 6 digits: plenty for display, and short on the wire.
fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
