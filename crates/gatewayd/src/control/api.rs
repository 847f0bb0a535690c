//! The `/admin/*` endpoints and `GET /metrics`: parse the request, ask the admin owner or read the
//! router's table, answer JSON. Thin on purpose: rules live in the admin owner and in bch-core.

use std::sync::Arc;

use std::net::SocketAddr;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bch_core::policy::PolicyPatch;
use bch_core::router::PoolId;
use bch_core::telemetry::ChangeSource;

use super::handle::ControlPlane;
use super::peer::Peer;
use crate::admin::{Actor, AdminError};
use crate::clock::now_ms;
use crate::config::WorkerConfig;
use crate::error::GatewayError;

/// Largest control plane request body, bytes: a worker entry or a policy patch is a few hundred.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What the answers to runtime changes say: they are not written anywhere.
pub const RUNTIME_NOTE: &str = "runtime change: lost on the next reload or restart; GET /admin/config gives the configuration in force as TOML to persist it";

/// What the answers to a drain and an undrain say about how long the change lasts. Unlike the
/// other runtime changes, a worker's drain state is kept across reloads while the file still lists
/// the worker (the router carries worker states over a membership change, like health) and across
/// DNS refreshes while DNS still has it; only a restart starts every worker active again.
pub const DRAIN_NOTE: &str = "drain state: kept across reloads while the configuration lists the worker, and across DNS refreshes while DNS has it; a restart starts every worker active";

/// The HTTP client as an [`Actor`]: `http` and its address (when the server recorded it).
fn http_actor(peer: Option<SocketAddr>) -> Actor {
    Actor::client(ChangeSource::Http, peer)
}

/// The answer to a runtime change: the fields of `answer` (a record, the policy) and
/// `"note": RUNTIME_NOTE`.
#[derive(serde::Serialize)]
struct Noted<T> {
    #[serde(flatten)]
    answer: T,
    note: &'static str,
}

/// `answer` with the note that the change is not persisted.
fn with_note<T>(answer: T) -> Noted<T> {
    Noted {
        answer,
        note: RUNTIME_NOTE,
    }
}

/// `answer` with the note that a drain state survives a reload but not a restart.
fn with_drain_note<T>(answer: T) -> Noted<T> {
    Noted {
        answer,
        note: DRAIN_NOTE,
    }
}

/// The answer to a drain: the worker's record and whether it leaves the membership once idle.
#[derive(serde::Serialize)]
struct Drained<T> {
    #[serde(flatten)]
    record: T,
    remove_when_idle: bool,
}

/// `GET /metrics`: the Prometheus text of every `bch_` metric.
pub async fn metrics(State(plane): State<Arc<ControlPlane>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&plane.registry),
    )
        .into_response()
}

/// `GET /admin/workers`: every worker's record, configuration order.
pub async fn list_workers(State(plane): State<Arc<ControlPlane>>) -> Response {
    let records = plane.router.table().worker_records(now_ms());
    Json(serde_json::json!({ "workers": records })).into_response()
}

/// `GET /admin/discovery`: every DNS discovery source in force, configuration order, with its
/// state (`pending`, `ok`, `failing`, `empty`), last error, age of the last good answer (ms) and
/// workers.
pub async fn discovery(State(plane): State<Arc<ControlPlane>>) -> Response {
    let sources = plane.admin.discovery_health(now_ms());
    Json(serde_json::json!({ "sources": sources })).into_response()
}

/// `POST /admin/workers`: adds a worker (`{"url", "name"?, "ring_id"?, "health_path"?}`); 201 with
/// its record.
pub async fn add_worker(
    State(plane): State<Arc<ControlPlane>>,
    Peer(peer): Peer,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let worker: WorkerConfig = parse_json(&body_bytes(body)?)?;
    let record = plane.admin.add_worker(worker, &http_actor(peer))?;
    Ok((StatusCode::CREATED, Json(with_note(record))).into_response())
}

/// `DELETE /admin/workers/{name}`: removes a worker; its in-flight requests finish.
pub async fn remove_worker(
    State(plane): State<Arc<ControlPlane>>,
    Peer(peer): Peer,
    Path(name): Path<String>,
) -> Result<Response, GatewayError> {
    let spec = plane.admin.remove_worker(&name, &http_actor(peer))?;
    Ok(Json(with_note(
        serde_json::json!({"removed": {"name": spec.name, "url": spec.url}}),
    ))
    .into_response())
}

/// The body of `POST /admin/workers/{name}/drain`: empty, or `{"remove": true}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainRequest {
    /// Remove the worker from the membership once its last request ended.
    #[serde(default)]
    remove: bool,
}

/// `POST /admin/workers/{name}/drain`: no new requests for the worker; its in-flight ones finish.
/// Answers its record (state `draining`) and whether it will be removed when idle.
pub async fn drain_worker(
    State(plane): State<Arc<ControlPlane>>,
    Peer(peer): Peer,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let body = body_bytes(body)?;
    let request: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        parse_json(&body)?
    };
    let record = plane
        .admin
        .drain(&name, request.remove, &http_actor(peer))?;
    Ok(Json(with_drain_note(Drained {
        record,
        remove_when_idle: request.remove,
    }))
    .into_response())
}

/// `POST /admin/workers/{name}/undrain`: the worker takes new requests again.
pub async fn undrain_worker(
    State(plane): State<Arc<ControlPlane>>,
    Peer(peer): Peer,
    Path(name): Path<String>,
) -> Result<Response, GatewayError> {
    let record = plane.admin.undrain(&name, &http_actor(peer))?;
    Ok(Json(with_drain_note(record)).into_response())
}

/// `GET /admin/policy`: the policy in force.
pub async fn get_policy(State(plane): State<Arc<ControlPlane>>) -> Response {
    Json(*plane.router.table().policy()).into_response()
}

/// `PUT /admin/policy`: applies any subset of `kind`, `min_load_gap`, `max_load_skew`,
/// `spill_order`, `virtual_nodes`, `load_source`; answers the policy in force, with a note that the
/// change is not persisted.
pub async fn put_policy(
    State(plane): State<Arc<ControlPlane>>,
    Peer(peer): Peer,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let patch: PolicyPatch = parse_json(&body_bytes(body)?)?;
    let policy = plane.admin.set_policy(&patch, &http_actor(peer))?;
    Ok(Json(with_note(policy)).into_response())
}

/// `GET /admin/config`: the configuration in force, runtime changes included, as TOML that can
/// be saved as the configuration file (see `config::persist`).
pub async fn get_config(State(plane): State<Arc<ControlPlane>>) -> Response {
    match crate::config::persist::to_toml(
        &plane.admin.config().load(),
        plane.admin.pinned_workers(),
    ) {
        Ok(text) => (
            [(header::CONTENT_TYPE, "application/toml; charset=utf-8")],
            text,
        )
            .into_response(),
        // A validated configuration always renders; say so if it ever does not.
        Err(error) => GatewayError::ConfigNotRendered(error.to_string()).into_response(),
    }
}

/// `GET /admin/picker`: whether the endpoint picker is on, the pool it serves (`model`, `null`
/// for the one pool of a fleet without models), that pool's workers by name and how many of them
/// take requests now.
pub async fn picker(State(plane): State<Arc<ControlPlane>>) -> Response {
    let enabled = plane.admin.config().load().picker.listen.is_some();
    let model = plane.admin.settings().load().picker_model.clone();
    let table = plane.router.table();
    let pool = match model.as_deref() {
        Some(model) => table.pool_of_model(model),
        None => Some(PoolId::FIRST),
    };
    let workers: Vec<&str> = (pool.and_then(|pool| table.pool(pool)))
        .map(|pool| pool.workers())
        .unwrap_or_default()
        .iter()
        .map(|&w| table.workers()[w].spec.name.as_str())
        .collect();
    Json(serde_json::json!({
        "enabled": enabled,
        "model": model.as_deref(),
        "workers": workers,
        "routable_workers": pool.map_or(0, |pool| table.routable_count_in(pool)),
    }))
    .into_response()
}

/// `POST /admin/reload`: re-reads the configuration file; answers the policy and workers in force.
pub async fn reload(State(plane): State<Arc<ControlPlane>>) -> Result<Response, GatewayError> {
    plane.admin.reload().map_err(reload_refusal)?;
    let table = plane.router.table();
    Ok(Json(serde_json::json!({
        "reloaded": true,
        "policy": table.policy(),
        "workers": table.worker_records(now_ms()),
    }))
    .into_response())
}

/// The answer to a failed `POST /admin/reload`: everything a reload refuses comes from the file,
/// so it is `invalid_config` with the whole chain (file and field) in the message; only a gateway
/// without a file says so.
fn reload_refusal(error: AdminError) -> GatewayError {
    match error {
        AdminError::NoConfigFile => GatewayError::from(error),
        AdminError::Config(_)
        | AdminError::Tls(_)
        | AdminError::Worker(_)
        | AdminError::Membership(_)
        | AdminError::Alias(_)
        | AdminError::Loop(_)
        | AdminError::Policy(_)
        | AdminError::UnknownWorker(_)
        | AdminError::Discovered { .. } => {
            GatewayError::InvalidConfig(crate::error::display_chain(&error))
        }
    }
}

/// The request body, or the OpenAI-shaped refusal of one axum could not read (over
/// [`MAX_BODY_BYTES`], or broken off).
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, GatewayError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            GatewayError::ControlBodyTooLarge {
                limit: MAX_BODY_BYTES,
            }
        } else {
            GatewayError::InvalidJson(format!("cannot read the request body: {rejection}"))
        }
    })
}

/// The JSON body as `T`; the refusal names the failing field when there is one.
fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, GatewayError> {
    serde_json::from_slice(body).map_err(|e| {
        GatewayError::InvalidJson(match failing_field::<T>(body) {
            Some(field) => format!("invalid request body: {field}: {e}"),
            None => format!("invalid request body: {e}"),
        })
    })
}

/// serde_json names unknown and missing fields but not a field whose value has the wrong type
/// (`{"max_load_skew":"NaN"}` gives "invalid type: string, expected f64"). For a JSON object, the
/// culprit is the first field whose removal changes (or cures) the error.
fn failing_field<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<String> {
    let serde_json::Value::Object(map) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    let error_of = |map: serde_json::Map<String, serde_json::Value>| {
        serde_json::from_value::<T>(serde_json::Value::Object(map))
            .err()
            .map(|e| e.to_string())
    };
    let whole = error_of(map.clone())?;
    map.keys()
        .find(|key| {
            let mut without = map.clone();
            without.remove(*key);
            error_of(without).as_ref() != Some(&whole)
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, FieldError};

    #[test]
    fn a_refused_reload_names_file_and_field_and_a_missing_file_says_so() {
        let invalid = || {
            AdminError::Config(ConfigError::Invalid {
                path: Some("/etc/bch/gatewayd.toml".into()),
                error: FieldError::new("policy.max_load_skew", "must be at least 1.0"),
            })
        };
        // The answer it always gave: anyhow's `{:#}` of the whole chain.
        let chain = format!("{:#}", anyhow::Error::from(invalid()));
        assert_eq!(
            reload_refusal(invalid()),
            GatewayError::InvalidConfig(chain)
        );
        let missing = reload_refusal(AdminError::NoConfigFile);
        assert_eq!(
            (missing.status().as_u16(), missing.code()),
            (409, "no_config_file")
        );
    }
}
