//! The browser guard: a web page the operator happens to have open must not be able to drive the
//! control plane, which without a token is open to anything that can reach loopback.
//!
//! A page can reach `127.0.0.1:9090` in three ways, each refused here (docs/api.md, "Browsers"):
//!
//! - a cross-site "simple" request (a form, or `fetch` in `no-cors` mode): it can only carry
//!   `text/plain`, form or multipart bodies, so a write must say `Content-Type: application/json`,
//!   which no page can send cross-site without a CORS preflight the control plane never approves;
//! - a websocket or any request from a page's script: the browser names the page in `Origin`, which
//!   must be the control plane's own origin or one allowed in `[server] control_allowed_origins`;
//! - DNS rebinding (a page on `attacker.example` whose name then resolves to 127.0.0.1, making the
//!   control plane "same-origin"): the browser sends `Host: attacker.example`, and a tokenless
//!   control plane answers only to its own address, `localhost` and the names in
//!   `[server] control_allowed_hosts`.
//!
//! With a token the bearer check comes first and is the protection (a page knows no token and
//! cannot send an `Authorization` header cross-site), so the `Host` check is off there: such a
//! control plane may listen on every interface and be reached by any name.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, Version, header};

use crate::error::GatewayError;

/// What the guard lets through, fixed at start-up.
#[derive(Debug, Clone)]
pub struct BrowserGuard {
    /// Host names (lower case, no port) a tokenless control plane answers to; `None` when a
    /// token protects it and any `Host` is fine.
    hosts: Option<Vec<String>>,
    /// Extra origins allowed, lower case, without a trailing slash.
    origins: Vec<String>,
}

impl BrowserGuard {
    /// The guard of a control plane bound to `listener`; `tokenless` turns the `Host` check on.
    /// `hosts` and `origins` are `[server] control_allowed_hosts` and `control_allowed_origins`.
    pub fn new(
        listener: SocketAddr,
        tokenless: bool,
        hosts: &[String],
        origins: &[String],
    ) -> Self {
        let hosts = tokenless.then(|| {
            let own = match listener {
                SocketAddr::V4(v4) => v4.ip().to_string(),
                SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
            };
            [own, "localhost".to_owned()]
                .into_iter()
                .chain(hosts.iter().map(|h| host_name(h)))
                .collect()
        });
        let origins = origins
            .iter()
            .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
            .collect();
        Self { hosts, origins }
    }

    /// Why `request` is refused, if it is: a missing or foreign `Host`, a foreign `Origin`, a
    /// write that is not JSON.
    pub fn check(
        &self,
        method: &Method,
        version: Version,
        headers: &HeaderMap,
    ) -> Result<(), GatewayError> {
        let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or(""));
        if host.is_none() && version >= Version::HTTP_11 {
            return Err(GatewayError::MissingControlHost);
        }
        let host = host.unwrap_or("");
        if let Some(allowed) = &self.hosts {
            let name = host_name(host);
            if host.is_empty() && version < Version::HTTP_11 {
                // HTTP/1.0 without Host: no browser sends that.
            } else if !allowed.contains(&name) {
                return Err(GatewayError::HostNotAllowed(format!(
                    "the control plane does not answer to Host {host:?}; add the name to [server] control_allowed_hosts if it is yours"
                )));
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("").trim_end_matches('/');
            let own = origin
                .strip_prefix("http://")
                .is_some_and(|rest| !host.is_empty() && rest.eq_ignore_ascii_case(host));
            if !own && !self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
                return Err(GatewayError::OriginNotAllowed(format!(
                    "requests from the web page at {origin:?} are refused; add the origin to [server] control_allowed_origins if it is yours"
                )));
            }
        }
        if is_write(method) && (has_body(headers) || headers.contains_key(header::CONTENT_TYPE)) {
            let json = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
            if !json {
                return Err(GatewayError::UnsupportedMediaType);
            }
        }
        Ok(())
    }
}

/// `Host` without its port, lower case, without a trailing dot (`[::1]:9090` → `[::1]`).
fn host_name(host: &str) -> String {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or(host, |end| &host[..end + 2]),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether the request announces a body: a non-zero `Content-Length` or any `Transfer-Encoding`.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_port_case_and_trailing_dot() {
        assert_eq!(host_name("127.0.0.1:9090"), "127.0.0.1");
        assert_eq!(host_name("LocalHost.:9090"), "localhost");
        assert_eq!(host_name("[::1]:9090"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("gw.internal"), "gw.internal");
    }
}
