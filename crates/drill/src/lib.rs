//! bch drills: everything needed to exercise a bch gateway without a GPU.
//!
//! - [`worker`]: simulated OpenAI-compatible inference workers whose latency follows a small, documented
//!   model of a continuous-batching engine with a prefix (KV) cache ([`sim`]).
//! - [`storm`]: a load generator that fires groups of sibling requests sharing a routing key and a long
//!   prompt prefix, and reports throughput, TTFT, placement, spill and cached-token fraction.
//! - `ab`: an A/B harness that switches the gateway policy between cells through the control API,
//!   interleaves repetitions and reports paired throughput ratios with 95% confidence intervals.
//!
//! Without Cargo features the crate is [`sim`], [`worker`] and the background storm of [`storm`]:
//! what `gatewayd --demo` links, without plotting or terminal libraries. The `harness` feature adds the measured storm, its report and the
//! A/B harness (with indicatif and plotters); `cli`, the default, adds the `bch-drill` binary. See
//! docs/drill.md, "Cargo features".
//!
//! A worker fleet for a demo or a test is one call away:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use bch_drill::sim::SimConfig;
//! use bch_drill::worker::spawn_workers;
//!
//! let workers = spawn_workers(3, 0, SimConfig::default()).await?;
//! for w in &workers {
//!     println!("{} {}", w.name(), w.url());
//! }
//! for w in workers {
//!     w.shutdown().await?;
//! }
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

// Dependencies point one way, so each module can be read (and feature-gated) without those above
// it: `ab` uses `storm`, `worker` (the simulator's config path), `control`, `stats` and `sim`;
// `storm` uses `sim` and `tls`, and with the harness `control` and `stats`; `worker` uses `cache` and `sim`;
// `cache` uses `sim`; `control` uses `tls`; `sim`, `tls` and `stats` use nothing of the crate.

#[cfg(feature = "harness")]
pub mod ab;
pub mod sim;
pub mod storm;
pub mod tls;
pub mod worker;

mod cache;
#[cfg(feature = "harness")]
mod control;
#[cfg(feature = "harness")]
mod stats;
