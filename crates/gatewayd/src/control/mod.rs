//! The control plane: metrics, the admin API and the telemetry websocket (docs/api.md,
//! docs/protocol.md).
//!
//! Every route sits behind the bearer-token check when `admin_token_file` is set (the token of
//! `metrics_token_file`, when set, opens `GET /metrics` and a read-only `GET /ws`, whose write
//! commands are refused, and nothing else), then behind the browser
//! guard (`Host`, `Origin`, `Content-Type`: a web page cannot drive it). Errors use the same OpenAI
//! shape as the data plane, 404, 405 and 413 included, and name the offending field. Files:
//! `handle` (the handle handlers share), `peer` (who sent a change), `guard`, `api` (`/admin/*`,
//! `/metrics`), `explain`, `ws` (telemetry), `reply` (errors as responses).

mod api;
mod explain;
pub mod guard;
pub mod handle;
mod peer;
mod reply;
mod ws;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use subtle::ConstantTimeEq;

use crate::error::GatewayError;
pub use handle::ControlPlane;

/// The control plane's routes over `plane`.
pub fn router(plane: Arc<ControlPlane>) -> Router {
    Router::new()
        .route("/metrics", get(api::metrics))
        .route(
            "/admin/workers",
            get(api::list_workers).post(api::add_worker),
        )
        .route("/admin/workers/{name}", delete(api::remove_worker))
        .route("/admin/workers/{name}/drain", post(api::drain_worker))
        .route("/admin/workers/{name}/undrain", post(api::undrain_worker))
        .route("/admin/config", get(api::get_config))
        .route("/admin/discovery", get(api::discovery))
        .route("/admin/picker", get(api::picker))
        .route("/admin/policy", get(api::get_policy).put(api::put_policy))
        .route("/admin/explain", get(explain::explain))
        .route("/admin/reload", post(api::reload))
        .route("/ws", get(ws::websocket))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&plane),
            browser_guard,
        ))
        // Outermost: without the token nothing else is even looked at.
        .layer(middleware::from_fn_with_state(
            Arc::clone(&plane),
            require_token,
        ))
        .with_state(plane)
}

async fn not_found() -> GatewayError {
    GatewayError::NotFound
}

async fn method_not_allowed() -> GatewayError {
    GatewayError::MethodNotAllowed
}

/// The browser guard ([`guard`]): `Host`, `Origin` and `Content-Type`, after the bearer check.
async fn browser_guard(
    State(plane): State<Arc<ControlPlane>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(refused) = plane
        .guard
        .check(request.method(), request.version(), request.headers())
    {
        return refused.into_response();
    }
    next.run(request).await
}

async fn require_token(
    State(plane): State<Arc<ControlPlane>>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &plane.token {
        // The scheme name is case-insensitive (RFC 9110 §11.1); the token is not.
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes())
            .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
            .map_or(&b""[..], |v| &v[7..]);
        let read = request.method() == axum::http::Method::GET
            && matches!(request.uri().path(), "/metrics" | "/ws");
        let metrics_token = plane.metrics_token.as_deref().filter(|_| read);
        let admin = bool::from(presented.ct_eq(token.as_bytes()));
        let metrics = metrics_token.is_some_and(|t| bool::from(presented.ct_eq(t.as_bytes())));
        if !admin && !metrics {
            return GatewayError::Unauthorized.into_response();
        }
        if !admin {
            // The telemetry websocket opened with the metrics token watches and changes nothing.
            request.extensions_mut().insert(ws::ReadOnly);
        }
    }
    next.run(request).await
}
