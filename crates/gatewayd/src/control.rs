//! The control plane: metrics, the admin API and the telemetry websocket (DESIGN.md §7–§8).
//!
//! Every route sits behind the bearer-token check when `admin_token_file` is set. Errors use the
//! same OpenAI shape as the data plane and name the offending field.

use std::sync::{Arc, PoisonError};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use bch_core::policy::{PolicyPatch, PolicySettings};
use bch_core::router::MembershipError;
use bch_core::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};
use bch_core::telemetry::{
    Ack, ChangeSource, ClientCommand, CommandError, ServerMessage, WorkerRecord,
};
use subtle::ConstantTimeEq;

use crate::config::WorkerConfig;
use crate::gateway::Gateway;
use crate::telemetry::{encode_message, envelope};

/// Largest websocket message a client may send, bytes. Commands are tiny; anything bigger is abuse.
const MAX_CLIENT_MESSAGE: usize = 16 * 1024;

/// Builds the control plane router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/admin/workers", get(list_workers).post(add_worker))
        .route("/admin/workers/{name}", delete(remove_worker))
        .route("/admin/policy", get(get_policy).put(put_policy))
        .route("/admin/explain", get(explain))
        .route("/admin/reload", axum::routing::post(reload))
        .route("/ws", get(websocket))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&gateway),
            require_token,
        ))
        .with_state(gateway)
}

/// An OpenAI-shaped control plane error.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({
        "error": {"message": message.into(), "type": "control_error", "code": code}
    });
    (status, Json(body)).into_response()
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such control endpoint",
    )
}

async fn require_token(
    State(gateway): State<Arc<Gateway>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &gateway.admin_token {
        // The scheme name is case-insensitive (RFC 9110 §11.1); the token is not.
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes())
            .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
            .map_or(&b""[..], |v| &v[7..]);
        if !bool::from(presented.ct_eq(token.as_bytes())) {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(request).await
}

async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&gateway.registry),
    )
        .into_response()
}

/// Current worker records, configuration order.
pub fn worker_records(gateway: &Gateway) -> Vec<WorkerRecord> {
    gateway.router.table().worker_records()
}

async fn list_workers(State(gateway): State<Arc<Gateway>>) -> Response {
    Json(serde_json::json!({ "workers": worker_records(&gateway) })).into_response()
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        let message = match failing_field::<T>(body) {
            Some(field) => format!("invalid request body: {field}: {e}"),
            None => format!("invalid request body: {e}"),
        };
        Box::new(error(StatusCode::BAD_REQUEST, "invalid_json", message))
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

async fn add_worker(State(gateway): State<Arc<Gateway>>, body: axum::body::Bytes) -> Response {
    let worker: WorkerConfig = match parse_json(&body) {
        Ok(w) => w,
        Err(response) => return *response,
    };
    let spec = match worker.spec() {
        Ok(spec) => spec,
        Err((field, message)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_worker",
                format!("{field}: {message}"),
            );
        }
    };
    let _admin = gateway
        .admin_lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match gateway.router.add_worker(spec.clone()) {
        Ok(()) => {
            let mut config = (**gateway.config.load()).clone();
            config.workers.push(worker);
            gateway.config.store(Arc::new(config));
            tracing::info!(worker = %spec.name, url = %spec.url, "worker added");
            let record = worker_records(&gateway)
                .into_iter()
                .find(|w| w.name == spec.name);
            (StatusCode::CREATED, Json(record)).into_response()
        }
        Err(e) => error(StatusCode::CONFLICT, "worker_conflict", e.to_string()),
    }
}

async fn remove_worker(State(gateway): State<Arc<Gateway>>, Path(name): Path<String>) -> Response {
    let _admin = gateway
        .admin_lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match gateway.router.remove_worker(&name) {
        Ok(spec) => {
            let mut config = (**gateway.config.load()).clone();
            config.workers.retain(|w| w.url != spec.url);
            gateway.config.store(Arc::new(config));
            tracing::info!(worker = %spec.name, "worker removed");
            Json(serde_json::json!({"removed": {"name": spec.name, "url": spec.url}}))
                .into_response()
        }
        Err(MembershipError::UnknownWorker(_)) => error(
            StatusCode::NOT_FOUND,
            "unknown_worker",
            format!("no worker named {name:?}"),
        ),
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid_worker", e.to_string()),
    }
}

async fn get_policy(State(gateway): State<Arc<Gateway>>) -> Json<PolicySettings> {
    Json(*gateway.router.table().policy())
}

/// Applies a policy patch from either the HTTP API or a websocket command and announces it.
pub fn apply_policy(
    gateway: &Gateway,
    patch: &PolicyPatch,
    source: ChangeSource,
) -> Result<PolicySettings, String> {
    let before = *gateway.router.table().policy();
    let after = gateway
        .router
        .set_policy(patch)
        .map_err(|e| e.to_string())?;
    if after != before {
        tracing::info!(?source, kind = %after.kind, min_load_gap = after.min_load_gap, max_load_skew = after.max_load_skew, virtual_nodes = after.virtual_nodes, "policy changed");
        gateway.telemetry.policy_changed(source);
    }
    Ok(after)
}

async fn put_policy(State(gateway): State<Arc<Gateway>>, body: axum::body::Bytes) -> Response {
    let patch: PolicyPatch = match parse_json(&body) {
        Ok(p) => p,
        Err(response) => return *response,
    };
    match apply_policy(&gateway, &patch, ChangeSource::Http) {
        Ok(policy) => Json(policy).into_response(),
        Err(message) => error(StatusCode::BAD_REQUEST, "invalid_policy", message),
    }
}

/// `GET /admin/explain` query: `routing_key=K[&explicit=true|false]` or `target_worker=NAME`.
/// Values are kept as raw bytes after percent-decoding, so a key that is not UTF-8 is judged exactly
/// as the data plane judges the same bytes in a header (ignored), not silently repaired.
#[derive(Debug, Default)]
struct ExplainQuery {
    routing_key: Option<Vec<u8>>,
    explicit: bool,
    target_worker: Option<Vec<u8>>,
}

impl ExplainQuery {
    fn parse(raw: Option<&str>) -> Result<Self, String> {
        let mut query = ExplainQuery {
            explicit: true,
            ..Default::default()
        };
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            // Form encoding: '+' is a space.
            let value = value.replace('+', " ");
            let value: Vec<u8> = percent_encoding::percent_decode_str(&value).collect();
            match name {
                "routing_key" => query.routing_key = Some(value),
                "target_worker" => query.target_worker = Some(value),
                "explicit" => {
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

async fn explain(
    State(gateway): State<Arc<Gateway>>,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
) -> Response {
    let query = match ExplainQuery::parse(raw.as_deref()) {
        Ok(q) => q,
        Err(message) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!(
                    "{message}; expected ?routing_key=K[&explicit=true|false] or ?target_worker=NAME"
                ),
            );
        }
    };
    let table = gateway.router.table();
    let key = match (&query.target_worker, &query.routing_key) {
        (Some(target), _) => RoutingKey::Target(target),
        (None, Some(key)) if query.explicit => match ExplicitKey::parse(key) {
            Ok(k) => RoutingKey::Explicit(k),
            Err(reason) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_routing_key",
                    format!(
                        "routing_key would be ignored by the gateway ({}): it must be non-empty UTF-8 of at most 128 bytes",
                        reason.as_str()
                    ),
                );
            }
        },
        (None, Some(key)) if !key.is_empty() => {
            RoutingKey::Implicit(ImplicitKey::from_value(ImplicitSource::Authorization, key))
        }
        _ => RoutingKey::None,
    };
    let decision = table.explain(&key);
    let name = |w: usize| table.workers()[w].spec.name.clone();
    let loads: serde_json::Map<String, serde_json::Value> = table
        .workers()
        .iter()
        .map(|w| (w.spec.name.clone(), w.stats.active().into()))
        .collect();
    Json(serde_json::json!({
        "worker": decision.worker.map(name),
        "branch": decision.branch,
        "preferred": decision.preferred.map(name),
        "bound": decision.bound,
        "policy": table.policy(),
        "loads": loads,
        "note": match key {
            RoutingKey::None => Some("keyless requests pick the less loaded of two random healthy workers; explain shows one such pick"),
            _ => None,
        },
    }))
    .into_response()
}

async fn reload(State(gateway): State<Arc<Gateway>>) -> Response {
    match gateway.reload() {
        Ok(()) => Json(serde_json::json!({
            "reloaded": true,
            "policy": gateway.router.table().policy(),
            "workers": worker_records(&gateway),
        }))
        .into_response(),
        Err(e) if gateway.config_path.is_none() => {
            error(StatusCode::CONFLICT, "no_config_file", e.to_string())
        }
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid_config", format!("{e:#}")),
    }
}

async fn websocket(State(gateway): State<Arc<Gateway>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| serve_client(gateway, socket))
}

/// One websocket client: the only writer of its socket, so its frames carry a gap-free `seq`.
async fn serve_client(gateway: Arc<Gateway>, mut socket: WebSocket) {
    let (id, mut frames) = gateway.telemetry.register();
    let mut seq: u64 = 0;
    let shutdown = gateway.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = socket.send(Message::Close(Some(CloseFrame { code: 1001, reason: "gateway shutting down".into() }))).await;
                break;
            }
            frame = frames.recv() => {
                let Some(body) = frame else { break };
                if socket.send(Message::Text(envelope(seq, &body).into())).await.is_err() {
                    break;
                }
                seq += 1;
            }
            incoming = socket.recv() => {
                let reply = match incoming {
                    Some(Ok(Message::Text(text))) => handle_command(&gateway, id, text.as_str()),
                    Some(Ok(Message::Binary(_))) => Some(command_error(None, "binary messages are not supported; send JSON text")),
                    Some(Ok(Message::Close(_))) | None => break,
                    Some(Ok(_)) => None,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "websocket client sent a malformed frame; closing");
                        break;
                    }
                };
                if let Some(body) = reply {
                    if socket.send(Message::Text(envelope(seq, &body).into())).await.is_err() {
                        break;
                    }
                    seq += 1;
                }
            }
        }
    }
    gateway.telemetry.unregister(id);
}

fn command_error(id: Option<bch_core::telemetry::CommandId>, message: &str) -> Arc<str> {
    encode_message(&ServerMessage::Error(CommandError {
        id,
        message: message.to_owned(),
    }))
}

fn handle_command(gateway: &Gateway, client: u64, text: &str) -> Option<Arc<str>> {
    let command: ClientCommand = match serde_json::from_str(text) {
        Ok(c) => c,
        Err(e) => {
            // Echo the id back if the message was JSON with one, so the client can match it.
            let id = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| serde_json::from_value(v.get("id")?.clone()).ok());
            return Some(command_error(id, &format!("invalid command: {e}")));
        }
    };
    match command {
        ClientCommand::Resync { .. } => {
            gateway.telemetry.resync(client);
            None
        }
        ClientCommand::SetPolicy {
            id,
            kind,
            min_load_gap,
            max_load_skew,
        } => {
            let patch = PolicyPatch {
                kind,
                min_load_gap,
                max_load_skew,
                virtual_nodes: None,
            };
            Some(match apply_policy(gateway, &patch, ChangeSource::Ws) {
                Ok(policy) => encode_message(&ServerMessage::Ack(Ack { id, policy })),
                Err(message) => command_error(id, &message),
            })
        }
    }
}
