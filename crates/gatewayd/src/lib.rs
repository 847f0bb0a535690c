//! # gatewayd
//!
//! The bch gateway daemon: a reverse proxy in front of LLM inference workers that routes each
//! request by its routing key on a consistent-hash ring and, under `bounded_consistent_hashing`,
//! spills an explicit key off a clearly overloaded worker (DESIGN.md §5, `bch-core`).
//!
//! - [`proxy`]: the data plane (streaming, load guards that live as long as the response body,
//!   one retry after a failed connect, OpenAI-shaped errors);
//! - [`control`]: metrics, admin API and the telemetry websocket;
//! - [`telemetry`]: the aggregator that owns telemetry data and publishes frames;
//! - [`upstream`]: per-worker pools of keep-alive connections, driven by the request's own task;
//! - [`health`]: active probes; [`config`]: the TOML configuration; [`server`]: accept loops;
//! - [`cli`]: command-line parsing, `check-config` and `explain`; [`demo`]: `gatewayd --demo`.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod control;
pub mod demo;
pub mod gateway;
pub mod health;
pub mod metrics;
pub mod proxy;
pub mod server;
pub mod telemetry;
pub mod upstream;

pub use gateway::{Gateway, RunningGateway};
