//! The storm: groups of concurrent sibling requests sharing a routing key and a long prompt prefix.
//!
//! The default shape is the frozen eight-sibling pattern of the original bounded-policy A/B: 400 groups
//! of 8 siblings over 8 routing keys. Group `g` uses key `g mod keys` (or, in a hot-key storm, a key
//! drawn so that a few keys take most groups); its 8 siblings go out at once, all with a long common
//! prefix (`prefix_tokens` tokens: the key's, or with [`PrefixScope::Group`] a fresh one per group)
//! followed by a short suffix of their own (`suffix_tokens` tokens). `concurrency` groups are in flight at a time; a new group starts when
//! one finishes. With strict consistent hashing all siblings pile onto the key's worker, where the
//! prefix is cached; a bounded policy may spill some of them to a worker where it is not.
//!
//! Requests go to `POST {gateway}/v1/chat/completions` with the key in `routing_key_header`. Each
//! response's `x-bch-worker` and `x-bch-branch` headers give placement and branch (`unknown` when
//! absent, e.g. when pointing the storm straight at a worker).
//!
//! Only the background storm is built without the `harness` feature.
//!
//! An open-loop storm ([`OpenLoop`], `bch-drill storm --rate`) sends one request per arrival at a
//! rate for a duration instead, whatever is outstanding, so it can push a fleet past capacity.
//!
//! The pieces, each depending only on those listed before it: `prompts` (the prompt text),
//! `arrivals` (the open loop's settings and schedule), `shooter` (sending a request and reading its
//! answer), `config` (the measured storm's shape), `shape` (the shape as reported), `outcomes` (how
//! each request ended, overall and per replica), `overload` (answers against sheds, goodput, queue
//! wait, open-loop timing), `records` (per-request records), `report` (what it measured),
//! `open_loop` (firing at a rate), `run` (firing it), `sweep` (open-loop storms at rising rates),
//! and `background` (the endless demo storm, built on `prompts` and `shooter` only).

#[cfg(feature = "harness")]
mod arrivals;
mod background;
#[cfg(feature = "harness")]
mod config;
#[cfg(feature = "harness")]
mod open_loop;
#[cfg(feature = "harness")]
mod outcomes;
#[cfg(feature = "harness")]
mod overload;
mod prompts;
#[cfg(feature = "harness")]
mod records;
#[cfg(feature = "harness")]
mod report;
#[cfg(feature = "harness")]
mod run;
#[cfg(feature = "harness")]
mod shape;
mod shooter;
#[cfg(feature = "harness")]
mod sweep;

#[cfg(feature = "harness")]
pub use arrivals::{Arrival, OpenLoop};
pub use background::{BackgroundStormConfig, BackgroundSummary, background_storm};
#[cfg(feature = "harness")]
pub use config::StormConfig;
#[cfg(feature = "harness")]
pub use outcomes::{OutcomeCounts, ReplicaOutcomes};
#[cfg(feature = "harness")]
pub use overload::{OpenLoopReport, ShedSummary, WaitSummary};
pub use prompts::PrefixScope;
#[cfg(feature = "harness")]
pub use records::{RequestRecord, write_records};
#[cfg(feature = "harness")]
pub use report::{StormReport, TtftBasis, TtftSummary};
#[cfg(feature = "harness")]
pub use run::{run_storm, run_storm_until};
#[cfg(feature = "harness")]
pub use shape::StormShape;
#[cfg(feature = "harness")]
pub use sweep::{
    FALLING_SHARE, RateStep, SATURATED_SHARE, SweepConfig, SweepReport, SweepStep, run_sweep,
};

#[cfg(feature = "harness")]
pub use crate::control::{DrainCheck, ReplicaDrain};
