//! A worker's HTTP surface: the routes of a vLLM/SGLang server, the OpenAI error shape, and the path
//! of an inference request from the fault check through parsing to its answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::faults::{Fault, Refusal};
use super::generation::Generation;
use super::request::{Api, parse_job};
use super::response::{ResponseIds, full_response, stream_response};
use super::state::Shared;

/// Every route of a simulated worker, over its shared state.
pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route(SIM_CONFIG_PATH, get(sim_config))
        .with_state(shared)
}

/// An error in the OpenAI shape, `{"error": {"message", "type", "code"}}`, which gateways and clients
/// written for vLLM parse.
fn error_response(status: StatusCode, message: &str) -> Response {
    let body = json!({
        "error": {
            "message": message,
            "type": if status.is_server_error() { "server_error" } else { "invalid_request_error" },
            "code": status.as_u16(),
        }
    });
    (status, axum::Json(body)).into_response()
}

fn refused(refusal: Refusal) -> Response {
    match refusal {
        Refusal::EngineDown => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected fault: engine is down",
        ),
        Refusal::ShuttingDown => {
            error_response(StatusCode::SERVICE_UNAVAILABLE, "worker shutting down")
        }
    }
}

async fn chat_completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    serve_inference(shared, Api::Chat, body).await
}

async fn completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    serve_inference(shared, Api::Completion, body).await
}

async fn generate(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    serve_inference(shared, Api::Generate, body).await
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.fault.current() == Fault::Status500 {
        return refused(Refusal::EngineDown);
    }
    StatusCode::OK.into_response()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    if shared.fault.current() == Fault::Status500 {
        return refused(Refusal::EngineDown);
    }
    axum::Json(json!({
        "object": "list",
        "data": [{"id": shared.config.model, "object": "model", "created": 0, "owned_by": "bch-drill"}],
    }))
    .into_response()
}

/// Where a simulated worker answers its own parameters, so a harness can record what it measured
/// (a real server answers 404 there).
pub const SIM_CONFIG_PATH: &str = "/bch-sim/config";

/// `GET /bch-sim/config`: `{"name", "config": SimConfig}`.
async fn sim_config(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({"name": shared.name, "config": shared.config})).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &shared.metrics.registry) {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding metrics: {e}"),
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn serve_inference(shared: Arc<Shared>, api: Api, body: Bytes) -> Response {
    shared.metrics.requests.inc();
    if let Some(refusal) = shared.fault.admit(&shared.cancel).await {
        return refused(refusal);
    }
    let job = match parse_job(api, &body, shared.config.default_max_tokens) {
        Ok(job) => job,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let ids = ResponseIds::new(api, &shared, id);
    let generation = Generation::new(shared, &job.prompt, job.max_tokens);
    if job.stream {
        stream_response(generation, job, ids)
    } else {
        full_response(generation, job, ids).await
    }
}
