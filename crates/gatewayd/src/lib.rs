//! # gatewayd
//!
//! The bch gateway daemon: a reverse proxy in front of LLM inference workers that routes each
//! request by its routing key on a consistent-hash ring and, under `bounded_consistent_hashing`,
//! spills an explicit key off a clearly overloaded worker (docs/policy.md, `bch-core`).
//!
//! The library is what the `gatewayd` binary and the integration tests use: [`start`] a gateway
//! from [`StartOptions`] and stop it through [`RunningGateway`]; [`config`] is the TOML
//! configuration; [`cli`] is the command line. Everything else is private; docs/architecture.md
//! maps the modules:
//!
//! - `app`: the composition root (start-up, signals, logging);
//! - `admin`: the one owner of membership and policy changes;
//! - `routing`: the routing step both front ends share (key, decision, load, metrics, telemetry);
//! - `proxy`: the data plane (streaming, load guards that live as long as the response body, one
//!   retry after a failed connect, OpenAI-shaped errors);
//! - `picker`: Envoy's endpoint picker (ext_proc over gRPC; load held as long as the request's
//!   ext_proc stream; docs/envoy.md);
//! - `control`: metrics, the admin API and the telemetry websocket;
//! - `telemetry`: the aggregator that owns telemetry data and publishes frames;
//! - `upstream`: per-worker endpoints and pools of keep-alive connections, and TLS toward https
//!   workers (`[upstream.tls]`, shared with the prober and the scraper);
//! - `discovery`: workers from DNS (SRV, A/AAAA), handed to the admin owner;
//! - `drain_watch`: notices when a draining worker is idle (and removes it if asked);
//! - `scraper`: the scraper of the workers' own load gauges (`[load] source = "worker_metrics"`);
//! - `tls`: TLS configuration for the listeners and for https workers (docs/tls.md);
//! - `health`: active probes; `server`: accept loops; `metrics`: Prometheus; `error`: the one
//!   error type of gateway answers; `demo`: `gatewayd --demo` (cargo feature `demo`).
#![forbid(unsafe_code)]

mod admin;
mod admission;
mod app;
mod chunked;
pub mod cli;
mod clock;
pub mod config;
mod control;
#[cfg(feature = "demo")]
mod demo;
mod discovery;
mod drain_watch;
mod error;
mod health;
mod http1;
mod log_limit;
mod metrics;
mod model_branches;
mod per_worker;
mod picker;
mod pool_metrics;
mod proxy;
mod routing;
mod scraper;
mod server;
mod telemetry;
mod tls;
mod upstream;

pub use admin::ConfigOverrides;
pub use app::{Findings, RunningGateway, StartError, StartOptions, check, start};

/// Internals that the fuzz and allocation tests drive directly. Not a stable API.
#[doc(hidden)]
pub mod testing {
    pub use crate::app::picker_harness::SessionProbe;
    pub use crate::proxy::request::strip_hop_by_hop;
}
