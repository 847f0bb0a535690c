//! A value derived from a routing table's workers (their endpoints, their addresses), built once
//! per membership generation and then read without a lock by every request on that generation.
//!
//! A membership generation names one worker list ([`RoutingTable::membership_generation`]): what is
//! derived from the workers alone is the same for every table of the generation, so it is built by
//! the first request (or the writer that publishes the generation) and shared. A request still
//! holding a table of an older generation gets a private value, never the newer one indexed
//! differently, and never replaces the newer cached one.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::router::RoutingTable;

/// A value built for one membership generation; says which one.
pub trait PerGeneration {
    /// The membership generation of the table this value was built from.
    fn generation(&self) -> u64;
}

/// The value of the newest membership generation seen, rebuilt when the generation changes.
#[derive(Debug)]
pub struct GenerationCache<T> {
    current: ArcSwapOption<T>,
}

impl<T> Default for GenerationCache<T> {
    fn default() -> Self {
        Self {
            current: ArcSwapOption::empty(),
        }
    }
}

impl<T: PerGeneration> GenerationCache<T> {
    /// The value for `table`'s membership generation: a lock-free load when it is the cached one;
    /// otherwise built by `build` from `table`, and cached when it is newer than the cached one.
    pub fn for_table(
        &self,
        table: &RoutingTable,
        build: impl FnOnce(&RoutingTable) -> T,
    ) -> Arc<T> {
        let generation = table.membership_generation();
        if let Some(cached) = self.current.load_full() {
            if cached.generation() == generation {
                return cached;
            }
            if cached.generation() > generation {
                return Arc::new(build(table));
            }
        }
        let built = Arc::new(build(table));
        self.current.store(Some(Arc::clone(&built)));
        built
    }

    /// The cached value, if any generation was seen.
    pub fn current(&self) -> Option<Arc<T>> {
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySettings;
    use crate::router::{Router, WorkerSource, WorkerSpec};

    struct Built {
        generation: u64,
        workers: usize,
    }

    impl PerGeneration for Built {
        fn generation(&self) -> u64 {
            self.generation
        }
    }

    fn build(table: &RoutingTable) -> Built {
        Built {
            generation: table.membership_generation(),
            workers: table.workers().len(),
        }
    }

    fn spec(n: u16) -> WorkerSpec {
        WorkerSpec {
            name: format!("w{n}"),
            url: format!("http://127.0.0.1:{}", 30000 + n),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        }
    }

    #[test]
    fn built_once_per_generation_and_an_older_table_gets_its_own() {
        let router = Router::new(vec![spec(1)], PolicySettings::default()).unwrap();
        let cache = GenerationCache::default();
        assert!(cache.current().is_none());
        let old = router.table();
        let first = cache.for_table(&old, build);
        assert!(Arc::ptr_eq(
            &first,
            &cache.for_table(&old, |_| unreachable!())
        ));
        router.add_worker(spec(2)).unwrap();
        let new = cache.for_table(&router.table(), build);
        assert_eq!(new.workers, 2);
        let private = cache.for_table(&old, build);
        assert_eq!(private.workers, 1);
        assert!(!Arc::ptr_eq(&private, &first), "rebuilt, not cached");
        assert!(
            Arc::ptr_eq(&cache.current().unwrap(), &new),
            "the newer one stays"
        );
    }
}
