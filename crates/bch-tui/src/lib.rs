//! # bch-tui
//!
//! The operator console for gatewayd: live worker load bars with the bounded policy's spill bound,
//! ring ownership, per-key placement, the spill log, and runtime changes to `min_load_gap` and
//! `max_load_skew`, over gatewayd's telemetry websocket. What it shows and how to use it is in
//! `docs/tui.md`; the rule behind the bound is in `docs/policy.md`.
//!
//! Split the way tokio-console is: `conn` (the network task and the status it reports), `state`
//! (pure: frames and actions in, commands out), `view` (draws from `&State` only), `input` (keys →
//! actions) and `term` (the terminal guard), tied together by `app`. Dependencies point one way:
//! `app` uses everything, `view` reads `state` (and `conn`'s status, `input`'s key table), `state`
//! uses `conn`'s status types and `input`'s actions, and `conn` and `input` use nothing of the
//! crate. The modules are private; this root re-exports what the binary and the integration tests
//! use.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod app;
mod cli;
mod conn;
mod input;
mod recorder;
mod replay;
mod screen;
mod state;
mod term;
mod view;

pub use app::{App, ConnEvents, FRAME_BUDGET, run};
pub use cli::Cli;
pub use conn::{ConnConfig, ConnEvent, ConnHandle, ConnStatus};
pub use input::Action;
pub use recorder::Recorder;
pub use replay::{Replay, SPEEDS, run_replay};
pub use screen::screen_text;
pub use state::{
    Baseline, COMMAND_TIMEOUT, Change, CommandEntry, CommandState, DRAIN_WARNING_DEFAULT, Effect,
    FleetBound, FleetPicture, History, HistoryOf, KeyHistory, LoadTrails, MAX_DISCOVERY_SOURCES,
    MAX_HISTORY_KEYS, MAX_KEY_WORKERS, MAX_KEYS, MAX_PLACEMENTS, MAX_TEXT_BYTES, MAX_WORKER_MODELS,
    MAX_WORKERS, OverRule, Panel, Placement, PlacementHistory, Playback, Reason, Replica,
    ReplicaId, SPILL_LOG_CAP, Sample, Settings, Severity, SortColumn, State, TRAIL_LEN,
    TRAIL_STEP_MS, Ui, Warning, WorkerOrder,
};
pub use term::TerminalGuard;
pub use view::{draw, viewports};
