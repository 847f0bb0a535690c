//! Admission at the gateway: whether a request the router could not place for want of room
//! (`bch_core::decide::Decision::wait`) waits in the gateway's queue or is shed (docs/overload.md).
//! `queue` is the bounded fair queue both front ends wait in; `stats` holds the counters the queue
//! keeps and telemetry and `/metrics` read;
//! `metrics` the families `/metrics` shows.

pub mod metrics;
pub mod queue;
pub mod stats;

pub use queue::{AdmissionQueue, Admitted, QueueKey};
pub use stats::AdmissionStats;
