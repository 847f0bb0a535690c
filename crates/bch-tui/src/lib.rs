//! # bch-tui
//!
//! The operator console for gatewayd: live worker load bars with the bounded policy's spill bound,
//! ring ownership, per-key placement, the spill log, and runtime changes to `min_load_gap` and
//! `max_load_skew`, over gatewayd's telemetry websocket (DESIGN.md §8, §9; `docs/tui.md`).
//!
//! Split the way tokio-console is: [`conn`] (the connection state machine and its status),
//! [`state`] (pure: frames and actions in, commands out), [`view`] (draws from `&State` only),
//! [`input`] (key predicates → actions) and [`term`] (the terminal guard), tied together by
//! [`app`].
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod conn;
pub mod input;
pub mod state;
pub mod term;
pub mod view;
