//! The part of the configuration the data plane reads on every request, derived once per
//! configuration change and swapped as a whole, so a request never sees half of a reload.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bch_core::routing_key::RoutingHeaders;

use super::Config;

/// Per-request settings, derived from a [`Config`].
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Routing header names, lower case.
    pub routing_headers: RoutingHeaders,
    /// Largest request body accepted, bytes; larger gets 413.
    pub max_body_bytes: u64,
    /// Time the worker has to send response headers; then 504.
    pub first_byte_timeout: Duration,
    /// Time the client has to send its whole body, from its request head: `request_body_timeout_ms`,
    /// capped at the first-byte timeout (a body still arriving when that fires is the client's
    /// fault, not the worker's); then 408.
    pub request_body_timeout: Duration,
    /// Longest silence inside a streamed response body; then the stream is ended.
    pub stream_idle_timeout: Duration,
    /// Mark a worker unhealthy at once when a connection to it fails.
    pub passive_health: bool,
    /// Show explicit keys hashed in telemetry.
    pub redact_keys: bool,
    /// Endpoint picker: fallback endpoints listed after the chosen one.
    pub picker_fallbacks: usize,
    /// Endpoint picker: longest time a stream may go without a message from Envoy.
    pub picker_silent_stream_timeout: Duration,
    /// Endpoint picker: most streams open at once.
    pub picker_max_streams: usize,
    /// Endpoint picker: the model whose pool it serves ([`Config::picker_model`]); `None`: the
    /// one pool of a fleet without models.
    pub picker_model: Option<Arc<str>>,
    /// `[routing] default_model`: the model of a request that names none.
    pub default_model: Option<Arc<str>>,
    /// `[routing] key_from_rid`: the body's `rid`, its lineage stripped, is the routing key.
    pub key_from_rid: bool,
    /// `[routing] serve_loads`: the data plane answers `GET /loads` and `GET /get_loads` itself.
    pub serve_loads: bool,
}

impl RuntimeSettings {
    /// The settings `config` puts in force.
    pub fn from_config(config: &Config) -> Self {
        let timeouts = &config.server.timeouts;
        Self {
            routing_headers: RoutingHeaders {
                routing_key: config.routing.routing_key_header.to_ascii_lowercase(),
                target_worker: config.routing.target_worker_header.to_ascii_lowercase(),
            },
            max_body_bytes: config.server.limits.max_body_bytes,
            first_byte_timeout: timeouts.first_byte,
            request_body_timeout: timeouts.request_body.min(timeouts.first_byte),
            stream_idle_timeout: timeouts.stream_idle,
            passive_health: config.health.passive,
            redact_keys: config.telemetry.redact_keys,
            picker_fallbacks: config.picker.fallbacks,
            picker_silent_stream_timeout: config.picker.silent_stream_timeout,
            picker_max_streams: config.picker.max_streams,
            picker_model: config.picker_model().map(Arc::from),
            default_model: config.routing.default_model.as_deref().map(Arc::from),
            key_from_rid: config.routing.key_from_rid,
            serve_loads: config.routing.serve_loads,
        }
    }
}

/// The settings in force, shared by their one writer (the admin owner) and their readers (the data
/// plane): a lock-free load per request.
pub type SharedSettings = Arc<ArcSwap<RuntimeSettings>>;
