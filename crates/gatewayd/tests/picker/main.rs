//! The endpoint picker (Envoy's ext_proc): its state machine, what it allocates per request, and
//! parity with gatewayd's own data plane.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod allocations;
mod bounds;
mod health;
mod parity;
mod pools;
mod sessions;
mod trust;
