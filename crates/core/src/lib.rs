//! # bch-core
//!
//! The pure heart of bch: the consistent-hash [`ring`], [`routing_key`] extraction, the routing
//! [`policy`] with its bounded spill rule, [`load`] accounting, the atomically swapped routing
//! snapshot in [`router`], the offline [`explain`] what-if, and the [`telemetry`] wire types shared by
//! gatewayd and bch-tui.
//!
//! No I/O and no async runtime: everything here is deterministic given its inputs and is tested with
//! unit, property and golden-vector tests (`tests/fixtures/*.json`, computed by an independent
//! implementation of SGLang Model Gateway's placement).
#![forbid(unsafe_code)]

pub mod policy;
pub mod telemetry;
