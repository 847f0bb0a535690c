//! `bch_branch_total`'s counts per model, kept only when the fleet declares models: which model's
//! requests spill, from the routing step itself.
//!
//! The request path must not look a model's name up per decision: a decision knows its pool by
//! index ([`PoolId`]), so each membership generation gets one array of counters indexed by pool,
//! built once (through a name map, so a model keeps its counts when a membership change
//! renumbers the pools) and then read without a lock. A decision pays an atomic load of that
//! array and one counter increment; the name map's lock is taken only when a generation is first
//! seen.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bch_core::generation_cache::{GenerationCache, PerGeneration};
use bch_core::policy::Branch;
use bch_core::router::{PoolId, RoutingTable};

/// One model's decisions, by branch (indexed like [`Branch::ALL`]).
#[derive(Debug, Default)]
pub struct BranchCounts([AtomicU64; Branch::ALL.len()]);

impl BranchCounts {
    /// The decisions counted for the branch at `index` of [`Branch::ALL`].
    pub fn get(&self, index: usize) -> u64 {
        self.0.get(index).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// The counters of one membership generation's pools, indexed by [`PoolId`].
#[derive(Debug)]
struct PoolCounts {
    generation: u64,
    pools: Vec<(Arc<str>, Arc<BranchCounts>)>,
}

impl PerGeneration for PoolCounts {
    fn generation(&self) -> u64 {
        self.generation
    }
}

/// Every model's branch counts since start, and the current generation's counters by pool.
#[derive(Debug, Default)]
pub struct ModelBranches {
    /// Each model counted since start, by name: the source of every generation's array, so
    /// counts follow the name, never a pool index. Locked only when a generation is first seen.
    by_name: Mutex<BTreeMap<Arc<str>, Arc<BranchCounts>>>,
    per_pool: GenerationCache<PoolCounts>,
}

impl ModelBranches {
    /// Counts a decision of branch `index` (of [`Branch::ALL`]) taken in `pool` of `table`.
    /// Nothing for a fleet without models (its one family has no `model` label), nor for a pool
    /// the table does not have. Allocation-free and lock-free except on a table of a membership
    /// generation not seen before.
    pub fn record(&self, table: &RoutingTable, pool: PoolId, index: usize) {
        if !table.has_models() {
            return;
        }
        let counts = self.per_pool.for_table(table, |table| self.resolve(table));
        if let Some((_, counts)) = counts.pools.get(pool.index())
            && let Some(counter) = counts.0.get(index)
        {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts of `table`'s pools, in pool order (model name order): what a scrape shows.
    /// Empty for a fleet without models.
    pub fn of_pools(&self, table: &RoutingTable) -> Vec<(Arc<str>, Arc<BranchCounts>)> {
        if !table.has_models() {
            return Vec::new();
        }
        let counts = self.per_pool.for_table(table, |table| self.resolve(table));
        counts.pools.clone()
    }

    /// The counters of `table`'s pools, each model's found or created in the name map.
    fn resolve(&self, table: &RoutingTable) -> PoolCounts {
        let mut by_name = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        let pools = (table.pools().iter())
            .map(|pool| {
                let model = pool.model().cloned().unwrap_or_else(|| Arc::from(""));
                let counts = Arc::clone(by_name.entry(Arc::clone(&model)).or_default());
                (model, counts)
            })
            .collect();
        PoolCounts {
            generation: table.membership_generation(),
            pools,
        }
    }
}

#[cfg(test)]
mod tests {
    use bch_core::policy::PolicySettings;
    use bch_core::router::{Router, WorkerSource, WorkerSpec};

    use super::*;

    fn spec(name: &str, models: &[&str]) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            url: format!("http://{name}:8000"),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: models.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    /// A new model sorting in renumbers the pools; the counts stay with the model's name.
    #[test]
    fn counts_follow_the_model_when_pools_are_renumbered() {
        let router = Router::new(vec![spec("q", &["qwen"])], PolicySettings::default()).unwrap();
        let branches = ModelBranches::default();
        let table = router.table();
        branches.record(&table, table.pool_of_model("qwen").unwrap(), 1);
        router.add_worker(spec("l", &["llama"])).unwrap();
        let table = router.table();
        let qwen = table.pool_of_model("qwen").unwrap();
        assert_eq!(qwen, PoolId::new(1), "llama sorts first now");
        branches.record(&table, qwen, 1);
        let rows = branches.of_pools(&table);
        let names: Vec<&str> = rows.iter().map(|(m, _)| &**m).collect();
        assert_eq!(names, ["llama", "qwen"]);
        assert_eq!((rows[0].1.get(1), rows[1].1.get(1)), (0, 2));
    }

    #[test]
    fn a_fleet_without_models_counts_nothing_here() {
        let router = Router::new(vec![spec("a", &[])], PolicySettings::default()).unwrap();
        let branches = ModelBranches::default();
        branches.record(&router.table(), PoolId::FIRST, 0);
        assert!(branches.of_pools(&router.table()).is_empty());
    }
}
