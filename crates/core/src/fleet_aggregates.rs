//! The fleet aggregates the bounded rule reads — how many workers are routable, the sum of their
//! loads and the smallest one — kept up to date one change at a time, so a decision reads them in
//! O(1) instead of summing every worker.
//!
//! The minimum is kept with a count of routable workers per load level: a request taken or
//! released moves one worker one level up or down, so the minimum moves at most one level and
//! never needs a search. Only a worker leaving the routable set (unhealthy, drained, removed) can
//! empty the minimum's level; then the next non-empty level is searched upward, a walk over load
//! levels (not workers) that happens on writers' changes, never on a request. The sum is exact
//! (`u128`), so the mean is computed exactly as [`FleetLoad::of`] computes it, bit for bit.
//!
//! Levels up to [`DENSE_LEVELS`] are a vector; higher ones (a worker that reports a huge load in
//! `worker_metrics` mode, up to a billion requests) sit in an ordered map, so a wild report costs
//! one map entry, never a vector as long as the load.
//!
//! This module is pure bookkeeping: the router decides which changes to report (its selection
//! lock serialises them with decisions).

use std::collections::BTreeMap;

use crate::policy::FleetLoad;

/// Load levels counted without growing the table: levels above it are added when a load first
/// reaches them, which allocates (a fleet holding that many requests on one worker is rare).
const INITIAL_LEVELS: usize = 256;

/// Load levels below this are counted in the vector (grown up to it, 512 KiB); levels at or
/// above it in the ordered map.
pub const DENSE_LEVELS: u64 = 1 << 16;

/// Routable count, load sum and minimum load over a set of workers (loads in requests in flight),
/// updated per change in O(1) (except [`FleetAggregates::remove`] of the last worker at the
/// minimum, which searches the load levels upward).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetAggregates {
    /// Workers counted.
    routable: usize,
    /// Sum of their loads; `u128` as in [`FleetLoad::of`], so it never overflows.
    sum: u128,
    /// Smallest load among them; 0 when none is counted.
    min: u64,
    /// `levels[load]`: how many counted workers have exactly `load` requests in flight, for
    /// loads below [`DENSE_LEVELS`].
    levels: Vec<usize>,
    /// The same for loads at or above [`DENSE_LEVELS`]; only non-zero counts are kept.
    high_levels: BTreeMap<u64, usize>,
}

impl Default for FleetAggregates {
    fn default() -> Self {
        FleetAggregates {
            routable: 0,
            sum: 0,
            min: 0,
            levels: vec![0; INITIAL_LEVELS],
            high_levels: BTreeMap::new(),
        }
    }
}

impl FleetAggregates {
    /// The aggregates of workers with these loads (one per routable worker): O(n + highest load),
    /// what a new membership costs.
    pub fn of(loads: impl IntoIterator<Item = u64>) -> FleetAggregates {
        let mut aggregates = FleetAggregates::default();
        for load in loads {
            aggregates.add(load);
        }
        aggregates
    }

    /// Number of workers counted (the routable ones).
    pub fn routable(&self) -> usize {
        self.routable
    }

    /// Sum of the counted workers' loads, requests.
    pub fn sum(&self) -> u128 {
        self.sum
    }

    /// The minimum and mean load over the counted workers, exactly as [`FleetLoad::of`] computes
    /// them over the same loads; `None` when no worker is counted. O(1).
    pub fn fleet_load(&self) -> Option<FleetLoad> {
        (self.routable > 0).then(|| FleetLoad {
            min_load: self.min,
            mean_load: self.sum as f64 / self.routable as f64,
            healthy: self.routable,
        })
    }

    /// A worker with `load` requests in flight joins the counted set (it became routable).
    pub fn add(&mut self, load: u64) {
        self.step_level(load, true);
        self.sum += u128::from(load);
        self.routable += 1;
        if self.routable == 1 || load < self.min {
            self.min = load;
        }
    }

    /// A counted worker with `load` requests in flight leaves the set (unhealthy, drained or
    /// removed). When it was the last one at the minimum, the minimum is searched upward over the
    /// load levels.
    pub fn remove(&mut self, load: u64) {
        let count = self.level(load);
        if count == 0 {
            debug_assert!(false, "no counted worker has load {load}");
            return;
        }
        self.step_level(load, false);
        self.sum -= u128::from(load);
        self.routable -= 1;
        if self.routable == 0 {
            self.min = 0;
        } else if load == self.min && count == 1 {
            // Bounded by the levels: a counted worker exists above the emptied minimum.
            let above = self.next_level_above(load);
            debug_assert!(above.is_some(), "a counted worker exists above load {load}");
            self.min = above.unwrap_or(load + 1);
        }
    }

    /// A counted worker's load went from `from` to `from + 1` (it took a request). O(1).
    #[inline]
    pub fn raise(&mut self, from: u64) {
        let count = self.level(from);
        if count == 0 {
            debug_assert!(false, "no counted worker has load {from}");
            return;
        }
        self.step_level(from, false);
        self.step_level(from + 1, true);
        self.sum += 1;
        if from == self.min && count == 1 {
            self.min = from + 1;
        }
    }

    /// A counted worker's load went from `from` to `from − 1` (a request ended); `from` > 0. O(1).
    #[inline]
    pub fn lower(&mut self, from: u64) {
        if from == 0 || self.level(from) == 0 {
            debug_assert!(false, "no counted worker has load {from}");
            return;
        }
        self.step_level(from, false);
        self.step_level(from - 1, true);
        self.sum -= 1;
        self.min = self.min.min(from - 1);
    }

    /// How many counted workers have exactly `load`.
    fn level(&self, load: u64) -> usize {
        if load >= DENSE_LEVELS {
            return self.high_levels.get(&load).copied().unwrap_or(0);
        }
        self.levels.get(load as usize).copied().unwrap_or(0)
    }

    /// One more (`up`) or one fewer counted worker at `load`; the caller checked that one exists
    /// before taking one away. Grows the vector (doubling, up to [`DENSE_LEVELS`]) when `load` is
    /// beyond it.
    fn step_level(&mut self, load: u64, up: bool) {
        if load >= DENSE_LEVELS {
            let count = self.high_levels.entry(load).or_insert(0);
            if up {
                *count += 1;
            } else {
                *count -= 1;
                if *count == 0 {
                    self.high_levels.remove(&load);
                }
            }
            return;
        }
        let index = load as usize;
        if index >= self.levels.len() {
            let grown = (index + 1).max(self.levels.len() * 2);
            self.levels.resize(grown.min(DENSE_LEVELS as usize), 0);
        }
        if up {
            self.levels[index] += 1;
        } else {
            self.levels[index] -= 1;
        }
    }

    /// The lowest load above `load` at which a worker is counted.
    fn next_level_above(&self, load: u64) -> Option<u64> {
        let dense = (load + 1 < DENSE_LEVELS)
            .then(|| {
                let start = load as usize + 1;
                self.levels
                    .iter()
                    .skip(start)
                    .position(|&n| n > 0)
                    .map(|offset| (start + offset) as u64)
            })
            .flatten();
        dense.or_else(|| {
            self.high_levels
                .range(load.saturating_add(1).max(DENSE_LEVELS)..)
                .next()
                .map(|(&level, _)| level)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(loads: &[u64]) -> Option<FleetLoad> {
        FleetLoad::of(loads.iter().copied())
    }

    #[test]
    fn every_step_equals_the_plain_computation() {
        let mut loads = vec![3, 0, 0, 7];
        let mut aggregates = FleetAggregates::of(loads.iter().copied());
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        // The two workers at the minimum take a request each: the minimum moves up once both left.
        for w in [1, 2] {
            aggregates.raise(loads[w]);
            loads[w] += 1;
            assert_eq!(aggregates.fleet_load(), plain(&loads));
        }
        assert_eq!(aggregates.fleet_load().unwrap().min_load, 1);
        aggregates.lower(loads[0]);
        loads[0] -= 1;
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        // Removing the only workers at the minimum searches upward.
        aggregates.remove(loads[1]);
        loads.remove(1);
        aggregates.remove(loads[1]);
        loads.remove(1);
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        assert_eq!(aggregates.fleet_load().unwrap().min_load, 2);
        aggregates.add(0);
        loads.push(0);
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        for load in loads.drain(..) {
            aggregates.remove(load);
        }
        assert_eq!(aggregates.fleet_load(), None);
        assert_eq!((aggregates.routable(), aggregates.sum()), (0, 0));
    }

    #[test]
    fn loads_beyond_the_initial_levels_grow_them() {
        let far = INITIAL_LEVELS as u64 * 3;
        let mut aggregates = FleetAggregates::of([far, 1]);
        aggregates.raise(far);
        aggregates.remove(1);
        assert_eq!(aggregates.fleet_load(), plain(&[far + 1]));
    }

    #[test]
    fn huge_loads_are_counted_apart_and_found_as_the_minimum() {
        let huge = (1 << 30) + 5;
        let mut loads = vec![huge, DENSE_LEVELS, 2];
        let mut aggregates = FleetAggregates::of(loads.iter().copied());
        assert!(aggregates.levels.len() <= DENSE_LEVELS as usize);
        aggregates.raise(huge);
        loads[0] += 1;
        aggregates.lower(DENSE_LEVELS);
        loads[1] -= 1;
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        aggregates.remove(2);
        loads.remove(2);
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        aggregates.remove(DENSE_LEVELS - 1);
        loads.remove(1);
        assert_eq!(aggregates.fleet_load(), plain(&loads));
        assert_eq!(aggregates.fleet_load().unwrap().min_load, huge + 1);
        aggregates.lower(huge + 1);
        aggregates.remove(huge);
        assert_eq!(aggregates.fleet_load(), None);
        assert!(aggregates.high_levels.is_empty());
    }
}
