//! Admission at the gateway: whether a request the router could not place for want of room
//! (`bch_core::decide::Decision::wait`) waits in the gateway's queue or is shed (docs/policy.md,
//! "Capacity"). `stats` holds the counters the queue keeps and telemetry and `/metrics` read.

pub mod stats;

pub use stats::AdmissionStats;
