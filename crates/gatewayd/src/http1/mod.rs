//! The data plane's own HTTP/1.1 server: request heads parsed with `httparse` under hyper's
//! limits and answers, request bodies decoded as the proxy reads them, responses written with
//! hyper's framing rules — and a worker's chunked body relayed to the client in the framing it
//! came in, validated on its way ([`crate::chunked`]), rather than decoded into frames and
//! chunk-encoded again.
//!
//! hyper's server connection kept an 8 KiB read and an 8 KiB write buffer per client connection
//! for the connection's whole life, and re-encoded every relayed frame. Here a connection holds
//! its socket, the bytes that arrived before they were asked for, and a few words of state: reads
//! go into the polling task's stack, a response head is one buffer freed once written, and body
//! frames go out from their own `Bytes`. A held stream (the worker thinking between tokens)
//! holds no read or write buffer.
//!
//! One job per file: [`request_head`] (the head and its framing rules), [`request_body`] (the
//! body, `100 Continue`, the state the connection and its body share), [`response`] (the head
//! written, the body framed) and [`connection`] (the loop: keep-alive, pipelining, the header read
//! timeout, the client leaving, shutdown). The control plane and the endpoint picker stay on
//! hyper (axum, tonic): they hold no long streams.

pub mod connection;
pub mod request_body;
pub mod request_head;
pub mod response;

pub use connection::{ConnectionError, ConnectionOptions, serve_connection};
pub use request_body::{RequestBody, RequestBodyError};
pub use response::ChunkFramed;
