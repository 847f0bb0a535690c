//! The data plane: requests through a real gateway to real fake workers on loopback, HTTP/1 as
//! clients see it on the wire, worker connection reuse against odd framing, and fuzzing of
//! everything a client can send.

#[path = "../common/mod.rs"]
mod common;

mod fuzz;
mod http1;
mod models;
mod relay;
mod relay_edges;
mod relay_trailers;
mod requests;
mod smg;
mod upstream_framing;
