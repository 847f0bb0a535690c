//! The consistent-hash ring, placement-compatible with SGLang Model Gateway's `consistent_hashing`.
//!
//! Each worker contributes `virtual_nodes` points labelled `<ring id>#<i>` (i = 0..virtual_nodes);
//! a point's position is the first 8 bytes of the BLAKE3 digest of the label's UTF-8 bytes, read as
//! a little-endian `u64`. A routing key is hashed the same way; its owner is the first point whose
//! position is `>=` the key's, wrapping past the top. Keeping exactly this scheme means a fleet can
//! move from SGLang Model Gateway to bch (or back) without moving a single key, so warm KV caches
//! survive the migration.
//!
//! The ring is built only when membership changes and holds every registered worker whatever its
//! health: health is a filter applied while walking, so a flapping worker never moves other keys.
//! A membership change derives the new ring from the old one ([`Ring::rebuilt`]): only the joining
//! workers' points are hashed, so its cost follows the change, not the fleet.

use std::collections::HashMap;

use crate::ring_points::{hash_points, push_points, sort_points};
pub use crate::ring_points::{hash_position, set_build_threads};

/// MurmurHash3's 64-bit finaliser: a bijection that spreads every input bit over the output, so
/// scores of nearby inputs look unrelated.
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// An immutable ring over `workers.len()` workers, identified by their index in the slice given to
/// [`Ring::build`] (configuration order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Point positions, ascending. Kept apart from `owners` so the binary search touches only
    /// positions (8 bytes a point) and stays in cache.
    positions: Vec<u64>,
    /// `owners[i]` is the worker index owning `positions[i]`.
    owners: Vec<u32>,
    /// Point indices grouped by worker, ascending within each group: worker `w`'s points are
    /// `by_worker[w * virtual_nodes..(w + 1) * virtual_nodes]`. Lets [`Ring::first_in_set`] find a
    /// worker's next point by binary search instead of walking the ring.
    by_worker: Vec<u32>,
    /// `seeds[w]` is the position of worker `w`'s ring id: its half of the hash-seeded spill
    /// order's score ([`Ring::seeded_score`]). A function of the ring id, not of the index, so the
    /// order does not depend on configuration order.
    seeds: Vec<u64>,
    worker_count: usize,
    virtual_nodes: u32,
}

/// One contiguous stretch of the hash space owned by a worker: positions in `(start, end]`, i.e.
/// keys hashing after the previous point and up to and including this one. The arc that wraps past
/// `u64::MAX` is reported as two arcs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingArc {
    /// Exclusive start position (`None` means the very bottom, position 0, is included).
    pub start_exclusive: Option<u64>,
    /// Inclusive end position.
    pub end_inclusive: u64,
}

impl RingArc {
    /// Number of positions in the arc.
    pub fn len(&self) -> u128 {
        match self.start_exclusive {
            Some(start) => u128::from(self.end_inclusive) - u128::from(start),
            None => u128::from(self.end_inclusive) + 1,
        }
    }

    /// Never true: an arc always contains its end point. Present for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Ring {
    /// Builds the ring for `ring_ids` (each worker's URL as configured, or its `ring_id`), with
    /// `virtual_nodes` points each. Cost: `ring_ids.len() × virtual_nodes` BLAKE3 hashes, spread
    /// over the threads [`set_build_threads`] allows, plus a linear-time bucket sort; about 1 ms
    /// for 64 workers × 150 points.
    ///
    /// Placement does not depend on the order of `ring_ids` nor on the threads: points are sorted
    /// by position, and the (astronomically unlikely) equal positions are ordered by ring id.
    ///
    /// # Panics
    /// If there are more than `u32::MAX` workers or ring points.
    pub fn build<S: AsRef<str> + Sync>(ring_ids: &[S], virtual_nodes: u32) -> Ring {
        assert!(u32::try_from(ring_ids.len()).is_ok(), "too many workers");
        assert!(
            u32::try_from(ring_ids.len() * virtual_nodes as usize).is_ok(),
            "too many ring points"
        );
        let mut points = hash_points(ring_ids, virtual_nodes);
        sort_points(&mut points, |index| ring_ids[index as usize].as_ref());
        let seeds = ring_ids
            .iter()
            .map(|id| hash_position(id.as_ref().as_bytes()))
            .collect();
        Ring::assemble(
            points.iter().map(|p| p.0).collect(),
            points.iter().map(|p| p.1).collect(),
            seeds,
            virtual_nodes,
        )
    }

    /// The ring of `ring_ids` made from `self`, the ring of `previous_ids` with the same
    /// `virtual_nodes`: placement identical to `Ring::build(ring_ids, self.virtual_nodes())`, at
    /// the cost of the change. Points of workers in both lists are kept (renumbered to their index
    /// in `ring_ids`), those of workers only in `previous_ids` dropped, and only the joining
    /// workers' points are hashed, sorted and merged in: one linear pass over the points plus
    /// `joining × virtual_nodes` hashes, instead of hashing and sorting every point. Any reorder,
    /// insertion or removal is allowed; workers are matched by ring id.
    ///
    /// # Panics
    /// If `previous_ids` is not the list `self` was built from (its length differs), or if there
    /// are more than `u32::MAX` workers.
    pub fn rebuilt<S: AsRef<str>, T: AsRef<str> + Sync>(
        &self,
        previous_ids: &[S],
        ring_ids: &[T],
    ) -> Ring {
        assert_eq!(
            previous_ids.len(),
            self.worker_count,
            "not this ring's workers"
        );
        assert!(u32::try_from(ring_ids.len()).is_ok(), "too many workers");
        let new_index: HashMap<&str, u32> = ring_ids
            .iter()
            .enumerate()
            .map(|(index, id)| (id.as_ref(), index as u32))
            .collect();
        // Where each previous worker went; `u32::MAX` for one that left.
        let renumber: Vec<u32> = previous_ids
            .iter()
            .map(|id| new_index.get(id.as_ref()).copied().unwrap_or(u32::MAX))
            .collect();
        let mut stayed = vec![false; ring_ids.len()];
        for &index in renumber.iter().filter(|&&i| i != u32::MAX) {
            stayed[index as usize] = true;
        }
        let mut seeds = vec![0u64; ring_ids.len()];
        for (previous, &index) in renumber.iter().enumerate() {
            if index != u32::MAX {
                seeds[index as usize] = self.seeds[previous];
            }
        }
        let mut joining: Vec<(u64, u32)> = Vec::new();
        let mut label = String::new();
        for (index, id) in ring_ids.iter().enumerate() {
            if stayed[index] {
                continue;
            }
            let id = id.as_ref();
            seeds[index] = hash_position(id.as_bytes());
            push_points(
                &mut joining,
                &mut label,
                id,
                index as u32,
                self.virtual_nodes,
            );
        }
        let ring_id = |index: u32| ring_ids[index as usize].as_ref();
        // The order `build` sorts by: position, then ring id (renumbering keeps the kept points'
        // order, since neither key depends on the index).
        let before = |a: (u64, u32), b: (u64, u32)| (a.0, ring_id(a.1)) < (b.0, ring_id(b.1));
        sort_points(&mut joining, ring_id);
        let total = self.positions.len() - self.dropped_points(&renumber) + joining.len();
        assert!(u32::try_from(total).is_ok(), "too many ring points");
        let mut positions = Vec::with_capacity(total);
        let mut owners = Vec::with_capacity(total);
        let mut incoming = joining.into_iter().peekable();
        for (&position, &owner) in self.positions.iter().zip(&self.owners) {
            let owner = renumber[owner as usize];
            if owner == u32::MAX {
                continue;
            }
            while let Some(&point) = incoming.peek() {
                if !before(point, (position, owner)) {
                    break;
                }
                positions.push(point.0);
                owners.push(point.1);
                incoming.next();
            }
            positions.push(position);
            owners.push(owner);
        }
        for (position, owner) in incoming {
            positions.push(position);
            owners.push(owner);
        }
        Ring::assemble(positions, owners, seeds, self.virtual_nodes)
    }

    /// Points of the workers `renumber` drops (those mapped to `u32::MAX`).
    fn dropped_points(&self, renumber: &[u32]) -> usize {
        renumber.iter().filter(|&&i| i == u32::MAX).count() * self.virtual_nodes as usize
    }

    /// The ring from its sorted points and each worker's seed: groups the point indices by worker.
    fn assemble(
        positions: Vec<u64>,
        owners: Vec<u32>,
        seeds: Vec<u64>,
        virtual_nodes: u32,
    ) -> Ring {
        let per_worker = virtual_nodes as usize;
        let mut by_worker = vec![0u32; owners.len()];
        let mut filled = vec![0usize; seeds.len()];
        for (index, &owner) in owners.iter().enumerate() {
            let owner = owner as usize;
            by_worker[owner * per_worker + filled[owner]] = index as u32;
            filled[owner] += 1;
        }
        Ring {
            positions,
            owners,
            by_worker,
            worker_count: seeds.len(),
            seeds,
            virtual_nodes,
        }
    }

    /// Number of workers the ring was built for.
    pub fn worker_count(&self) -> usize {
        self.worker_count
    }

    /// Points per worker.
    pub fn virtual_nodes(&self) -> u32 {
        self.virtual_nodes
    }

    /// Total number of points.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// True when the ring has no worker.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Index of the first point at or clockwise after `position` (binary search, no allocation).
    /// `None` on an empty ring.
    pub fn first_point(&self, position: u64) -> Option<usize> {
        if self.positions.is_empty() {
            return None;
        }
        let index = self.positions.partition_point(|&p| p < position);
        Some(if index == self.positions.len() {
            0
        } else {
            index
        })
    }

    /// Worker indices of every point clockwise from `position`, one full turn, starting with the
    /// owner of `position`. Consecutive and repeated owners are included: callers that want the
    /// first worker satisfying a test can apply it point by point without a visited set (a worker
    /// that failed once fails again), which keeps routing allocation-free.
    pub fn points_from(&self, position: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.first_point(position).unwrap_or(0);
        // Two plain slice walks instead of indexing with `% len`: no division per point.
        let (before, from) = self.owners.split_at(start);
        from.iter().chain(before).map(|&owner| owner as usize)
    }

    /// The first worker clockwise from `position` whose bit is set in `workers` (bit `w` stands for
    /// worker index `w`, so only workers 0..64 can be named): exactly
    /// `points_from(position).find(|&w| w < 64 && workers >> w & 1 == 1)`, without walking up to
    /// the whole ring. `None` when no named worker is on the ring.
    ///
    /// A short walk answers when many workers are named; otherwise each named worker's next point
    /// is found by binary search over its own points and the nearest wins. This bounds the bounded
    /// policy's spill search when only a few workers are under the bound, which is exactly when a
    /// plain walk is longest (hundreds of points on a 64-worker ring). No allocation.
    pub fn first_in_set(&self, position: u64, workers: u64) -> Option<usize> {
        /// Points walked before switching to per-worker search: with half the fleet named, the
        /// walk fails this long with probability 2^-16.
        const WALK: usize = 16;
        let n = self.owners.len();
        let start = self.first_point(position)?;
        let named = |w: usize| w < 64 && (workers >> w) & 1 == 1;
        let walk = WALK.min(n);
        let (before, from) = self.owners.split_at(start);
        if let Some(&w) = from
            .iter()
            .chain(before)
            .take(walk)
            .find(|&&w| named(w as usize))
        {
            return Some(w as usize);
        }
        if walk == n {
            return None;
        }
        let mut nearest: Option<(usize, usize)> = None;
        let mut rest = workers;
        while rest != 0 {
            let worker = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if worker >= self.worker_count {
                break;
            }
            let next = self.next_point_of(worker, start);
            let distance = if next >= start {
                next - start
            } else {
                next + n - start
            };
            if nearest.is_none_or(|(d, _)| distance < d) {
                nearest = Some((distance, worker));
            }
        }
        nearest.map(|(_, worker)| worker)
    }

    /// Index of `worker`'s first point at or after point index `start`, else (wrapping) of its
    /// first point: one binary search over the worker's own points. The ring must not be empty.
    fn next_point_of(&self, worker: usize, start: usize) -> usize {
        let per_worker = self.virtual_nodes as usize;
        let points = &self.by_worker[worker * per_worker..(worker + 1) * per_worker];
        let next = points
            .get(points.partition_point(|&p| (p as usize) < start))
            .unwrap_or(&points[0]);
        *next as usize
    }

    /// The distinct workers clockwise from `position` for which `accept` is true, each once, in
    /// ring order (pingora's `select_with`): a worker is yielded at its first point of the turn.
    /// `accept` is asked point by point, so it must answer the same for every point of a worker.
    /// Allocation-free: whether a point is its owner's first of the turn is one binary search over
    /// that worker's points, done only for accepted points. Stops after one full turn.
    pub fn workers_clockwise<'a>(
        &'a self,
        position: u64,
        mut accept: impl FnMut(usize) -> bool + 'a,
    ) -> impl Iterator<Item = usize> + 'a {
        let n = self.owners.len();
        let start = self.first_point(position).unwrap_or(0);
        (start..n).chain(0..start).filter_map(move |point| {
            let worker = self.owners[point] as usize;
            (accept(worker) && self.next_point_of(worker, start) == point).then_some(worker)
        })
    }

    /// Rank of `worker` in the hash-seeded spill order of a key at `position`: the worker with the
    /// highest score comes first (rendezvous hashing). For a fixed key the scores of the workers are
    /// pseudo-random and independent of each other, so ordering by score is a per-key random
    /// permutation that needs no allocation; a worker's score depends on its ring id, so replicas
    /// that list the workers in another order agree. Panics if `worker` is not on the ring.
    pub fn seeded_score(&self, position: u64, worker: usize) -> u64 {
        fmix64(position ^ self.seeds[worker])
    }

    /// The worker ranked first in the hash-seeded order of `position` among those for which
    /// `include` is true; ties (equal 64-bit scores, practically never) go to the larger seed, again
    /// independent of configuration order. One pass over the workers, no allocation.
    pub fn first_seeded(
        &self,
        position: u64,
        mut include: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let mut best: Option<((u64, u64), usize)> = None;
        for worker in 0..self.worker_count {
            if !include(worker) {
                continue;
            }
            let rank = (self.seeded_score(position, worker), self.seeds[worker]);
            if best.is_none_or(|(b, _)| rank > b) {
                best = Some((rank, worker));
            }
        }
        best.map(|(_, worker)| worker)
    }

    /// [`Ring::first_seeded`] over the workers whose bit is set in `workers` (bit `w` stands for
    /// worker `w`; only workers 0..64 can be named). Visits only the named workers.
    pub fn first_seeded_in_set(&self, position: u64, workers: u64) -> Option<usize> {
        let mut best: Option<((u64, u64), usize)> = None;
        let mut rest = workers;
        while rest != 0 {
            let worker = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if worker >= self.worker_count {
                break;
            }
            let rank = (self.seeded_score(position, worker), self.seeds[worker]);
            if best.is_none_or(|(b, _)| rank > b) {
                best = Some((rank, worker));
            }
        }
        best.map(|(_, worker)| worker)
    }

    /// Every worker in the hash-seeded order of `position`, first-ranked first. Allocates: the
    /// order tests compare routing against (routing itself uses [`Ring::first_seeded`]).
    pub fn seeded_order(&self, position: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.worker_count).collect();
        order.sort_by_key(|&w| std::cmp::Reverse((self.seeded_score(position, w), self.seeds[w])));
        order
    }

    /// Every worker clockwise from `position`, each once, in ring order, as a list: the order
    /// tests and benchmarks compare routing against (routing walks [`Ring::workers_clockwise`]).
    pub fn workers_from(&self, position: u64) -> Vec<usize> {
        self.workers_clockwise(position, |_| true)
            .take(self.worker_count)
            .collect()
    }

    /// The owner of `position` ignoring health: the first point at or after it.
    pub fn owner(&self, position: u64) -> Option<usize> {
        self.first_point(position).map(|i| self.owners[i] as usize)
    }

    /// Each worker's fraction of the hash space (sums to 1.0 on a non-empty ring).
    pub fn shares(&self) -> Vec<f64> {
        let mut owned = vec![0u128; self.worker_count];
        for (worker, arc) in self.arcs() {
            owned[worker] += arc.len();
        }
        let total = 2f64.powi(64);
        owned.into_iter().map(|n| n as f64 / total).collect()
    }

    /// Every arc with its owner, in position order; adjacent arcs of the same owner are merged.
    pub fn arcs(&self) -> Vec<(usize, RingArc)> {
        let mut arcs: Vec<(usize, RingArc)> = Vec::new();
        let n = self.positions.len();
        if n == 0 {
            return arcs;
        }
        // Keys above the last point wrap to the first point, so the first point's owner also owns
        // (last, u64::MAX]: reported as a separate arc at the top of the ring.
        for i in 0..n {
            let owner = self.owners[i] as usize;
            let start = if i == 0 {
                None
            } else {
                Some(self.positions[i - 1])
            };
            let end = self.positions[i];
            match arcs.last_mut() {
                Some((last_owner, last)) if *last_owner == owner => last.end_inclusive = end,
                _ => arcs.push((
                    owner,
                    RingArc {
                        start_exclusive: start,
                        end_inclusive: end,
                    },
                )),
            }
        }
        let last = self.positions[n - 1];
        if last != u64::MAX {
            let owner = self.owners[0] as usize;
            arcs.push((
                owner,
                RingArc {
                    start_exclusive: Some(last),
                    end_inclusive: u64::MAX,
                },
            ));
        }
        arcs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_ring_has_no_owner() {
        let ring = Ring::build::<&str>(&[], 150);
        assert!(ring.is_empty());
        assert_eq!(ring.owner(42), None);
        assert!(ring.arcs().is_empty());
    }

    #[test]
    fn lookup_wraps_past_the_top() {
        let ring = Ring::build(&["a", "b"], 4);
        let first_owner = ring.owners[0] as usize;
        let top_owner = if *ring.positions.last().unwrap() == u64::MAX {
            *ring.owners.last().unwrap() as usize
        } else {
            first_owner
        };
        assert_eq!(ring.owner(u64::MAX), Some(top_owner));
        assert_eq!(ring.owner(0), Some(first_owner));
        assert_eq!(ring.owner(ring.positions[1]), Some(ring.owners[1] as usize));
        assert_eq!(
            ring.owner(ring.positions[1] + 1),
            Some(ring.owners[2] as usize)
        );
    }

    #[test]
    fn shares_sum_to_one_and_arcs_cover_the_ring() {
        let ring = Ring::build(&["w1", "w2", "w3"], 150);
        let shares = ring.shares();
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let covered: u128 = ring.arcs().iter().map(|(_, a)| a.len()).sum();
        assert_eq!(covered, 1u128 << 64);
    }

    #[test]
    fn workers_from_lists_each_worker_once() {
        let ring = Ring::build(&["a", "b", "c", "d"], 150);
        let mut order = ring.workers_from(hash_position(b"k"));
        assert_eq!(order[0], ring.owner(hash_position(b"k")).unwrap());
        order.sort();
        assert_eq!(order, vec![0, 1, 2, 3]);
    }
}
