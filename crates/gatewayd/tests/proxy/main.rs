//! The data plane: requests through a real gateway to real fake workers on loopback, worker
//! connection reuse against odd framing, and fuzzing of everything a client can send.

#[path = "../common/mod.rs"]
mod common;

mod fuzz;
mod models;
mod relay;
mod requests;
mod smg;
mod upstream_framing;
