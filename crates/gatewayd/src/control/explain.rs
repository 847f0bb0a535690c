//! `GET /admin/explain`: what a key would get right now, and why, without reserving load. The
//! decision is the router's own (`RoutingTable::explain`), so it is exactly what routing does;
//! `fleet_loads` shows, per worker, the local and the fleet-wide numbers and which one the rule
//! read. With capacity, the answer says what a request that finds no room waits for (`wait`),
//! each worker's `capacity` and `full` flag, and `full=NAME` asks what would happen were NAME full.

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use bch_core::admission::Wait;
use bch_core::decide::{Decision, FleetView, decide};
use bch_core::explain::WorkerLoad;
use bch_core::fleet_load::LoadSignal;
use bch_core::router::RoutingTable;
use bch_core::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};

use super::handle::ControlPlane;
use crate::error::GatewayError;

/// `GET /admin/explain` query: `routing_key=K[&explicit=true|false]` or `target_worker=NAME`, and
/// any number of `full=NAME` (workers assumed full).
/// Values are kept as raw bytes after percent-decoding, so a key that is not UTF-8 is judged exactly
/// as the data plane judges the same bytes in a header (ignored), not silently repaired.
#[derive(Debug, Default)]
struct ExplainQuery {
    routing_key: Option<Vec<u8>>,
    explicit: bool,
    target_worker: Option<Vec<u8>>,
    /// Workers to answer as if they were full (at their cap or saturated), by name.
    full: Vec<String>,
    /// The model whose pool decides (needed when the gateway serves several).
    model: Option<Vec<u8>>,
}

impl ExplainQuery {
    fn parse(raw: Option<&str>) -> Result<Self, String> {
        let mut query = ExplainQuery {
            explicit: true,
            ..Default::default()
        };
        let mut seen_explicit = false;
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            // Form encoding: '+' is a space.
            let value = value.replace('+', " ");
            let value: Vec<u8> = percent_encoding::percent_decode_str(&value).collect();
            // A repeated parameter would explain one of two keys and hide which.
            let once = |slot: &Option<Vec<u8>>| match slot {
                Some(_) => Err(format!("{name} given more than once")),
                None => Ok(()),
            };
            match name {
                "routing_key" => {
                    once(&query.routing_key)?;
                    query.routing_key = Some(value);
                }
                "target_worker" => {
                    once(&query.target_worker)?;
                    query.target_worker = Some(value);
                }
                "model" => {
                    once(&query.model)?;
                    query.model = Some(value);
                }
                "full" => query
                    .full
                    .push(String::from_utf8_lossy(&value).into_owned()),
                "explicit" if seen_explicit => return Err("explicit given more than once".into()),
                "explicit" => {
                    seen_explicit = true;
                    query.explicit = match &value[..] {
                        b"true" => true,
                        b"false" => false,
                        _ => return Err("explicit must be true or false".into()),
                    }
                }
                other => return Err(format!("unknown query parameter {other:?}")),
            }
        }
        Ok(query)
    }
}

/// Whether a request header could carry `value` as it is: a header value has no control
/// characters but tab, and the HTTP parser drops leading and trailing whitespace.
fn carriable(value: &[u8]) -> bool {
    http::HeaderValue::from_bytes(value).is_ok()
        && !value.first().is_some_and(|b| matches!(b, b' ' | b'\t'))
        && !value.last().is_some_and(|b| matches!(b, b' ' | b'\t'))
}

/// `GET /admin/explain?routing_key=K[&explicit=true|false]` or `?target_worker=NAME`.
pub async fn explain(
    State(plane): State<Arc<ControlPlane>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, GatewayError> {
    let query = ExplainQuery::parse(raw.as_deref()).map_err(|message| {
        GatewayError::InvalidQuery(format!(
            "{message}; expected ?routing_key=K[&explicit=true|false] or ?target_worker=NAME, any full=NAME and model=M"
        ))
    })?;
    for (name, value) in [
        ("routing_key", &query.routing_key),
        ("target_worker", &query.target_worker),
    ] {
        if value.as_deref().is_some_and(|v| !carriable(v)) {
            return Err(GatewayError::InvalidRoutingKey(format!(
                "{name} holds bytes no request header can carry (control characters such as NUL, CR or LF, or leading or trailing whitespace): no request could have it"
            )));
        }
    }
    let table = plane.router.table();
    let key = match (&query.target_worker, &query.routing_key) {
        (Some(target), _) => RoutingKey::Target(target),
        (None, Some(key)) if query.explicit => {
            RoutingKey::Explicit(ExplicitKey::parse(key).map_err(|reason| {
                GatewayError::InvalidRoutingKey(format!(
                    "routing_key would be ignored by the gateway ({}): it must be non-empty UTF-8 of at most 128 bytes, without control characters and without a space at either end",
                    reason.as_str()
                ))
            })?)
        }
        (None, Some(key)) if !key.is_empty() => {
            RoutingKey::Implicit(ImplicitKey::from_value(ImplicitSource::Authorization, key))
        }
        _ => RoutingKey::None,
    };
    let mut assumed = vec![false; table.workers().len()];
    for worker in &query.full {
        let index = table.index_of(worker).ok_or_else(|| {
            GatewayError::InvalidQuery(format!("full={worker:?}: no worker has that name"))
        })?;
        assumed[index] = true;
    }
    let view = AssumingFull {
        table: &table,
        assumed: &assumed,
    };
    let (pool, model) = pool_of(&table, query.model.as_deref())?;
    let decision: Decision = match pool {
        Some(pool) => table.decide_in(pool, &key, &view, 0, 0),
        None => decide(table.ring(), table.policy(), &key, &view, 0, 0),
    };
    let in_pool = |w: usize| pool.is_none_or(|pool| table.pools_of_worker(w).contains(&pool));
    let name = |w: usize| table.workers()[w].spec.name.clone();
    let loads: serde_json::Map<String, serde_json::Value> = (table.workers().iter().enumerate())
        .filter(|(index, _)| in_pool(*index))
        .map(|(_, w)| (w.spec.name.clone(), w.stats.active().into()))
        .collect();
    let fleet_loads: Vec<FleetLoad> = (fleet_loads(&view).into_iter().enumerate())
        .filter(|(index, _)| in_pool(*index))
        .map(|(_, load)| load)
        .collect();
    let mut answer = serde_json::json!({
        "worker": decision.worker.map(name),
        "branch": decision.branch,
        "preferred": decision.preferred.map(name),
        "bound": decision.bound,
        "load_signal": decision.load_signal,
        "policy": table.policy(),
        "loads": loads,
        "fleet_loads": fleet_loads,
        "wait": decision.wait.map(|wait| match wait {
            Wait::ForWorker(w) => serde_json::json!({"for_worker": name(w)}),
            Wait::ForAnyWorker => serde_json::json!("for_any_worker"),
        }),
        "note": match key {
            RoutingKey::None => Some("keyless requests pick the less loaded of two random healthy workers; explain shows one such pick"),
            _ => None,
        },
    });
    // Only a gateway with models names one: older answers keep their shape.
    if let Some(model) = model {
        answer["model"] = model.into();
    }
    Ok(Json(answer).into_response())
}

/// The pool `model` names (`None` with no `model` in a fleet of one pool or none: the whole
/// table's ring, as routing), and the model to answer with. Several pools need a `model`; one the
/// table does not serve is refused, naming the ones it does.
fn pool_of(
    table: &RoutingTable,
    model: Option<&[u8]>,
) -> Result<(Option<bch_core::router::PoolId>, Option<String>), GatewayError> {
    let served = || {
        (table.pools().iter())
            .filter_map(|pool| pool.model().map(|m| format!("{m:?}")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(model) = model else {
        if table.pools().len() > 1 {
            return Err(GatewayError::InvalidQuery(format!(
                "model=M is required: this gateway serves several models ({}), each in its own pool",
                served()
            )));
        }
        return Ok((None, None));
    };
    let model = String::from_utf8_lossy(model).into_owned();
    match table.pool_of_model(&model) {
        Some(pool) => Ok((Some(pool), Some(model))),
        None if !table.has_models() => Err(GatewayError::InvalidQuery(format!(
            "model={model:?}: this gateway declares no models; leave model out"
        ))),
        None => Err(GatewayError::InvalidQuery(format!(
            "model={model:?}: no worker serves it (served: {})",
            served()
        ))),
    }
}

/// One worker's entry of `fleet_loads`: the rule's numbers, with the last report's age and
/// whether it is stale.
#[derive(serde::Serialize)]
struct FleetLoad {
    #[serde(flatten)]
    numbers: WorkerLoad,
    /// Age of the worker's last good scrape, milliseconds (`null`: never scraped).
    scrape_age_ms: Option<u64>,
    /// No fresh report: the rule reads this replica's local count.
    stale: bool,
    /// Requests in flight the worker may hold (`null`: no cap).
    capacity: Option<u64>,
    /// At its capacity or saturated (or assumed full by `full=NAME`): takes no new request.
    full: bool,
}

/// Per worker: this replica's count, the worker's last report and its age, the fleet-wide load and
/// the load the rule read (docs/replicas.md).
fn fleet_loads(view: &AssumingFull<'_>) -> Vec<FleetLoad> {
    let table = view.table;
    let source = table.policy().load_source;
    let records = table.worker_records(crate::clock::now_ms());
    table
        .workers()
        .iter()
        .zip(records)
        .enumerate()
        .map(|(index, (worker, record))| {
            let sample = worker.stats.fleet_sample().fresh();
            let mut numbers =
                WorkerLoad::new(worker.spec.name.clone(), record.active, sample, source);
            // A stale report is still worth seeing, marked as such.
            numbers.reported = numbers.reported.or(record.reported_load);
            FleetLoad {
                numbers,
                scrape_age_ms: record.scrape_age_ms,
                stale: record.load_stale,
                capacity: record.capacity,
                full: record.full || view.assumed[index],
            }
        })
        .collect()
}

/// The live table, with some workers assumed full (`full=NAME`): the decision is the router's own
/// over it, so the answer is what routing would do were those workers at their cap.
struct AssumingFull<'a> {
    table: &'a RoutingTable,
    /// Per worker, in the table's order.
    assumed: &'a [bool],
}

impl FleetView for AssumingFull<'_> {
    fn worker_count(&self) -> usize {
        self.table.worker_count()
    }

    fn routable(&self, worker: usize) -> bool {
        FleetView::routable(self.table, worker)
    }

    fn routable_count(&self) -> usize {
        FleetView::routable_count(self.table)
    }

    fn load(&self, worker: usize) -> u64 {
        self.table.load(worker)
    }

    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        self.table.load_with_signal(worker)
    }

    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.table.resolve_target(raw)
    }

    fn limited(&self) -> bool {
        self.table.limited() || self.assumed.contains(&true)
    }

    fn capacity(&self, worker: usize) -> Option<u64> {
        FleetView::capacity(self.table, worker)
    }

    /// An assumed-full worker is full whatever its load, as a saturated engine is.
    fn engine_full(&self, worker: usize) -> bool {
        self.assumed[worker] || self.table.engine_full(worker)
    }
}
