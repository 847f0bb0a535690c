//! The client's request made into a request for a worker: hop-by-hop header removal (RFC 9110
//! §7.6.1) and pointing the request at the chosen worker. The routing key is read by
//! `crate::routing::key`, which the endpoint picker shares.

use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Uri};

use crate::error::GatewayError;
use crate::upstream::{Endpoint, UpstreamBody};

/// The client's request made into a request for a worker, reusing its head (no header copies):
/// HTTP/1.1, without `Host` and hop-by-hop headers, extensions dropped. [`point_at`] then
/// gives it a worker's URI and `Host`.
pub fn upstream_request(parts: http::request::Parts, body: UpstreamBody) -> Request<UpstreamBody> {
    let mut request = Request::from_parts(parts, body);
    *request.version_mut() = http::Version::HTTP_11;
    request.extensions_mut().clear();
    let headers = request.headers_mut();
    headers.remove(header::HOST);
    strip_hop_by_hop(headers);
    request
}

/// Points `request` at `target`: origin-form URI (the worker's path prefix, then the client's path
/// and query) and the worker's `Host`. Called again when a retry moves the request to another
/// worker.
pub fn point_at(
    request: &mut Request<UpstreamBody>,
    client_path: Option<&http::uri::PathAndQuery>,
    target: &Endpoint,
) -> Result<(), GatewayError> {
    let uri = if target.url.prefix.is_empty() {
        // The common case shares the client's path instead of copying it.
        Uri::from(
            client_path
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        )
    } else {
        let path_and_query = client_path.map_or("/", http::uri::PathAndQuery::as_str);
        format!("{}{path_and_query}", target.url.prefix)
            .parse::<Uri>()
            .map_err(|_| GatewayError::BadUpstreamUri {
                worker: target.name.clone(),
            })?
    };
    *request.uri_mut() = uri;
    if let Some(host) = &target.host_header {
        request.headers_mut().insert(header::HOST, host.clone());
    }
    Ok(())
}

/// Hop-by-hop headers that are never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers (RFC 9110 §7.6.1): the fixed list plus any named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests and responses carry none: one pass over the names (cheap comparisons for
    // standard headers) instead of nine hashed removals.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        headers.insert("x-secret-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert("x-smg-routing-key", HeaderValue::from_static("k"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["authorization", "x-smg-routing-key"]);
    }
}
