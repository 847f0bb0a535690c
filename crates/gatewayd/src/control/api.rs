//! The `/admin/*` endpoints and `GET /metrics`: parse the request, ask the admin owner or read the
//! router's table, answer JSON. Thin on purpose: rules live in the admin owner and in bch-core.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bch_core::policy::{PolicyPatch, PolicySettings};
use bch_core::telemetry::ChangeSource;

use super::state::ControlPlane;
use crate::admin::AdminError;
use crate::config::WorkerConfig;
use crate::error::GatewayError;
use crate::telemetry::wire::now_ms;

/// Largest control plane request body, bytes: a worker entry or a policy patch is a few hundred.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

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

/// `POST /admin/workers`: adds a worker (`{"url", "name"?, "ring_id"?, "health_path"?}`); 201 with
/// its record.
pub async fn add_worker(
    State(plane): State<Arc<ControlPlane>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let worker: WorkerConfig = parse_json(&body_bytes(body)?)?;
    let record = plane.admin.add_worker(worker)?;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

/// `DELETE /admin/workers/{name}`: removes a worker; its in-flight requests finish.
pub async fn remove_worker(
    State(plane): State<Arc<ControlPlane>>,
    Path(name): Path<String>,
) -> Result<Response, GatewayError> {
    let spec = plane.admin.remove_worker(&name)?;
    Ok(Json(serde_json::json!({"removed": {"name": spec.name, "url": spec.url}})).into_response())
}

/// `GET /admin/policy`: the policy in force.
pub async fn get_policy(State(plane): State<Arc<ControlPlane>>) -> Json<PolicySettings> {
    Json(*plane.router.table().policy())
}

/// `PUT /admin/policy`: applies any subset of `kind`, `min_load_gap`, `max_load_skew`,
/// `spill_order`, `virtual_nodes`, `load_source`; answers the policy in force.
pub async fn put_policy(
    State(plane): State<Arc<ControlPlane>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PolicySettings>, GatewayError> {
    let patch: PolicyPatch = parse_json(&body_bytes(body)?)?;
    Ok(Json(plane.admin.set_policy(&patch, ChangeSource::Http)?))
}

/// `POST /admin/reload`: re-reads the configuration file; answers the policy and workers in force.
pub async fn reload(State(plane): State<Arc<ControlPlane>>) -> Result<Response, GatewayError> {
    plane.admin.reload().map_err(|error| match error {
        AdminError::NoConfigFile => GatewayError::from(error),
        // The whole chain, file and field included.
        other => GatewayError::InvalidConfig(format!("{:#}", anyhow::Error::from(other))),
    })?;
    let table = plane.router.table();
    Ok(Json(serde_json::json!({
        "reloaded": true,
        "policy": table.policy(),
        "workers": table.worker_records(now_ms()),
    }))
    .into_response())
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
