//! `IP:PORT` command-line values (listen addresses, the picker's address): parsed, never resolved.

use std::net::SocketAddr;

/// Parses an `IP:PORT` flag value; the error says what is expected (host names are not resolved).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("expected IP:PORT such as 127.0.0.1:8080 (host names are not resolved), got {s:?}")
    })
}
