//! The per-model families of `/metrics`, present only when the fleet declares models: which
//! models each worker serves (`bch_worker_models{worker,model}`), and per pool the routable
//! workers and the minimum and mean its bounded rule reads (`bch_pool_*{model}`). The per-worker
//! families keep their `worker` label alone: a worker's counters are the worker's whatever pools
//! it is in, and a dashboard joins them with `bch_worker_models` on `worker`.

use std::sync::Arc;

use bch_core::router::{PoolId, Router, RoutingTable};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::metrics::gauge;

/// Registers the per-model families of `router`'s table in force at each scrape.
pub fn register(registry: &mut Registry, router: Arc<Router>) {
    registry.register_collector(Box::new(PoolCollector { router }));
}

/// Reads the table in force at each scrape: pools come and go with the membership.
#[derive(Debug)]
struct PoolCollector {
    router: Arc<Router>,
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        pool_families(&mut encoder, &self.router, &self.router.table())
    }
}

/// Encodes the per-model families of `table` (nothing for a fleet without models).
fn pool_families(
    encoder: &mut DescriptorEncoder,
    router: &Router,
    table: &RoutingTable,
) -> Result<(), std::fmt::Error> {
    if !table.has_models() {
        return Ok(());
    }
    let serves = table.workers().iter().flat_map(|worker| {
        (worker.spec.models.iter()).map(|model| {
            (
                vec![
                    ("worker", worker.spec.name.clone()),
                    ("model", model.clone()),
                ],
                1i64,
            )
        })
    });
    gauge(
        encoder,
        "bch_worker_models",
        "1 for each model the worker serves (its pools); join on worker",
        serves,
    )?;
    let pools: Vec<(PoolId, String)> = (table.pools().iter().enumerate())
        .filter_map(|(index, pool)| Some((PoolId::new(index), pool.model()?.to_string())))
        .collect();
    let label = |model: &String| vec![("model", model.clone())];
    gauge(
        encoder,
        "bch_pool_routable_workers",
        "Workers of the model's pool that take new requests (healthy, not draining)",
        (pools.iter()).map(|(pool, model)| (label(model), table.routable_count_in(*pool) as i64)),
    )?;
    let loads: Vec<_> = (pools.iter())
        .filter_map(|(pool, model)| Some((model, router.fleet_load_in(*pool)?)))
        .collect();
    gauge(
        encoder,
        "bch_pool_load_min",
        "Least load over the pool's routable workers, the minimum its bounded rule reads (requests)",
        (loads.iter()).map(|(model, load)| (label(model), load.min_load as i64)),
    )?;
    gauge(
        encoder,
        "bch_pool_load_mean",
        "Mean load over the pool's routable workers, the mean its bounded rule reads (requests)",
        (loads.iter()).map(|(model, load)| (label(model), load.mean_load)),
    )
}
