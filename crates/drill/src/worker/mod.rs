//! Simulated OpenAI-compatible inference workers.
//!
//! Each worker is an axum server with the routes of a vLLM/SGLang server:
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/chat/completions` | OpenAI chat completion; SSE chunks with `"stream": true` |
//! | `POST /v1/completions` | OpenAI text completion; SSE chunks with `"stream": true` |
//! | `POST /generate` | SGLang native: `{"text", "sampling_params": {"max_new_tokens"}, "stream"}` |
//! | `GET /health` | 200 with an empty body |
//! | `GET /v1/models` | the one model, [`SimConfig::model`](crate::sim::SimConfig::model) |
//! | `GET /metrics` | Prometheus/OpenMetrics text with vLLM's metric names |
//! | `GET /bch-sim/config` | `{"name", "config"}`: the worker's [`SimConfig`](crate::sim::SimConfig) |
//!
//! A request's life follows [`crate::sim`]: wait in the FIFO queue for one of `max_batch` slots, look
//! its prompt up in the worker's prefix cache, prefill the uncached tokens in chunks that share each
//! engine step (and its prefill throughput) with other prefills and with the running decodes, then
//! produce one token per engine step. Time to first token is therefore queueing plus the steps that
//! carried its prefill. Responses report `usage.prompt_tokens`,
//! `usage.completion_tokens` and `usage.prompt_tokens_details.cached_tokens` as vLLM does; streams send
//! a final usage chunk when asked with `"stream_options": {"include_usage": true}` and always end with
//! `data: [DONE]`.
//!
//! Faults for tests are switched at run time with [`WorkerHandle::set_fault`].
//!
//! The pieces, each depending only on those listed before it: `faults` (the fault kinds and switch),
//! `engine` (the scheduler: admission, chunked prefill and decode steps on simulated time), `state`
//! (what a worker's requests share, and its metrics), `request` (the three request shapes),
//! `generation` (a request's life on simulated time), `response` (bodies and SSE streams), `api` (the
//! routes), `tls` (serving the routes over https, optionally requiring client certificates),
//! `handle` (starting a worker and owning it).

mod api;
mod engine;
mod faults;
mod generation;
mod handle;
mod request;
mod response;
mod state;
mod tls;

pub use api::SIM_CONFIG_PATH;
pub use faults::Fault;
pub use handle::{WorkerHandle, spawn_https_worker, spawn_worker, spawn_workers};
pub use state::SimStats;
pub use tls::server_tls_config;
