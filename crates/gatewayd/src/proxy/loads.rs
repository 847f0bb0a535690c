//! `GET /loads` (and `GET /get_loads`, SGLang Model Gateway's path) on the data plane: every
//! worker's load in SMG's `/get_loads` shape, `{"workers":[{"worker": URL, "load": N}]}`, so an SMG
//! or anything else that reads that endpoint can watch bch's fleet.
//!
//! `load` is the router's own per-worker load, the number its bounded rule compares: requests in
//! flight through this gateway, or the worker's reported load under `load_source =
//! "worker_metrics"`. SMG puts the worker's used KV tokens there (or -1 when unknown); the shape
//! is the same, the unit is bch's.

use bch_core::decide::FleetView;
use bch_core::router::RoutingTable;
use bytes::Bytes;

/// The paths the loads endpoint answers on.
pub const LOADS_PATHS: [&str; 2] = ["/loads", "/get_loads"];

/// One worker's entry: SMG's `WorkerLoadInfo` as its `/get_loads` serialises it.
#[derive(serde::Serialize)]
struct WorkerLoad<'a> {
    worker: &'a str,
    load: u64,
}

#[derive(serde::Serialize)]
struct Loads<'a> {
    workers: Vec<WorkerLoad<'a>>,
}

/// The body of `GET /loads`: every worker of the membership, in configuration order, healthy or
/// not (SMG lists every registered worker).
pub fn loads_body(table: &RoutingTable) -> Bytes {
    let workers = table
        .workers()
        .iter()
        .enumerate()
        .map(|(index, worker)| WorkerLoad {
            worker: &worker.spec.url,
            load: table.load(index),
        })
        .collect();
    Bytes::from(serde_json::to_vec(&Loads { workers }).expect("strings and numbers serialise"))
}
