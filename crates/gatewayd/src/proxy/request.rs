//! The client's request made into a request for a worker: the checks a request must pass before it
//! is routed, hop-by-hop header removal (RFC 9110 §7.6.1), this gateway's `Via`, and pointing the
//! request at the chosen worker. The routing key is read by `crate::routing::key`, which the
//! endpoint picker shares.

use std::hash::{BuildHasher, Hasher};

use bch_core::routing_key::RoutingHeaders;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

use crate::config::runtime::RuntimeSettings;
use crate::error::GatewayError;
use crate::upstream::{ClientBodyError, Endpoint, UpstreamBody};

/// This gateway's `Via` entry, `1.1 bch-` and 16 hex digits drawn at random when the process
/// starts: it names this gateway process and no other, so a request that comes back carrying it
/// looped (a worker URL leads back here), while a chain of different gateways is fine.
pub fn own_via() -> HeaderValue {
    // The standard library's hasher keys are random per process: 64 random bits, no dependency.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    HeaderValue::from_str(&format!("1.1 bch-{random:016x}")).expect("ASCII")
}

/// Why a request is refused before it is routed (no load is taken for it), if it is: a `CONNECT`
/// (405), an HTTP/1.1 request without `Host` (400), a request whose `Via` shows it already passed
/// through this gateway (508), or a second `Authorization`, routing key or target worker header
/// (400: the gateway routes by the first, a component behind it might read the other). Costs a
/// few comparisons and two header lookups on the usual request.
pub fn refuse_early(
    method: &Method,
    version: Version,
    headers: &HeaderMap,
    routing_headers: &RoutingHeaders,
    own_via: &HeaderValue,
) -> Result<(), GatewayError> {
    if *method == Method::CONNECT {
        return Err(GatewayError::TunnelNotSupported);
    }
    if version >= Version::HTTP_11 && !headers.contains_key(header::HOST) {
        return Err(GatewayError::MissingHost);
    }
    if headers.contains_key(header::VIA) {
        // The pseudonym, without the protocol another proxy might have rewritten.
        let pseudonym = &own_via.as_bytes()[4..];
        let passed = headers.get_all(header::VIA).iter().any(|v| {
            v.as_bytes()
                .windows(pseudonym.len())
                .any(|w| w == pseudonym)
        });
        if passed {
            return Err(GatewayError::LoopDetected);
        }
    }
    // Only a request with some header repeated has more values than names.
    if headers.len() != headers.keys_len() {
        for name in [
            header::AUTHORIZATION.as_str(),
            &routing_headers.routing_key,
            &routing_headers.target_worker,
        ] {
            if headers.get_all(name).iter().nth(1).is_some() {
                return Err(GatewayError::RepeatedHeader(name.to_owned()));
            }
        }
    }
    Ok(())
}

/// Most header fields a request to a worker may carry: hyper's limit, which gatewayd's own parser
/// applies to its clients and hyper-based engines apply to gatewayd. The gateway's own headers
/// count in it, so a request they would push over is refused by the gateway, not by the worker.
pub const MAX_FORWARDED_HEADERS: usize = 100;

/// Refuses (431) a request whose header fields would be more than [`MAX_FORWARDED_HEADERS`] once
/// the gateway's own are added: `sent` is how many the client sent; `headers` are the request's
/// now, with the gateway's `x-request-id` when it made the id; `Via` and, for a request without
/// one, `Host` are still to come. Nothing the gateway removes (hop-by-hop headers) is subtracted:
/// the framing header hyper writes for a chunked body takes the place of the client's.
pub fn check_header_budget(sent: usize, headers: &HeaderMap) -> Result<(), GatewayError> {
    let added =
        headers.len().saturating_sub(sent) + 1 + usize::from(!headers.contains_key(header::HOST));
    if sent + added > MAX_FORWARDED_HEADERS {
        return Err(GatewayError::TooManyHeaders {
            sent,
            added,
            limit: MAX_FORWARDED_HEADERS,
        });
    }
    Ok(())
}

/// The client's request made into a request for a worker, reusing its head (no header copies):
/// HTTP/1.1, without `Host` and hop-by-hop headers, with this gateway's `Via` entry appended
/// (RFC 9110 §7.6.3; a second field line, so an earlier proxy's entries stay as they were),
/// extensions dropped. [`point_at`] then gives it a worker's URI and `Host`.
pub fn upstream_request(
    parts: http::request::Parts,
    body: UpstreamBody,
    own_via: &HeaderValue,
) -> Request<UpstreamBody> {
    let mut request = Request::from_parts(parts, body);
    *request.version_mut() = http::Version::HTTP_11;
    request.extensions_mut().clear();
    let headers = request.headers_mut();
    headers.remove(header::HOST);
    strip_hop_by_hop(headers);
    headers.append(header::VIA, own_via.clone());
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
            .map_err(|_| GatewayError::BadUpstreamUri(target.name.clone()))?
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

/// [`HOP_BY_HOP`]'s bits (in [`strip_hop_by_hop`]'s set of the ones present) of `Connection` and
/// `Transfer-Encoding`.
const CONNECTION_BIT: u16 = 1 << 0;
const TRANSFER_ENCODING_BIT: u16 = 1 << 7;

/// Removes hop-by-hop headers (RFC 9110 §7.6.1): the fixed list plus any named in `Connection`.
/// A message framed by `Transfer-Encoding` also loses its `Content-Length`: hyper decoded the
/// body by the former, and a proxy must not forward the latter beside it (RFC 9112 §6.3), or the
/// next hop would cut the body at a length that was never true.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names (cheap comparisons for standard headers) finds the ones present;
    // only those are removed, instead of a hashed removal per name of the list. Most requests
    // carry none; a chunked response carries one.
    let mut present = 0u16;
    let mut content_length = false;
    for name in headers.keys() {
        if let Some(index) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present |= 1 << index;
        } else if name == header::CONTENT_LENGTH {
            content_length = true;
        }
    }
    if present == 0 {
        return;
    }
    if present & TRANSFER_ENCODING_BIT != 0 && content_length {
        headers.remove(header::CONTENT_LENGTH);
    }
    if present & CONNECTION_BIT != 0 {
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
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(name);
        }
    }
}

/// The answer to a request whose body failed on the client's side (it left mid-body, sent a
/// malformed chunked body, went over `max_body_bytes`, or was too slow): a 4xx, counted by
/// [`Exchange::fail`] in `bch_client_body_errors_total` and in the request's log line, never
/// against the worker (its error counter, passive health, a warning naming it).
pub fn client_refusal(settings: &RuntimeSettings, fault: &ClientBodyError) -> GatewayError {
    match fault {
        ClientBodyError::Incomplete => GatewayError::IncompleteRequestBody,
        ClientBodyError::Malformed(reason) => GatewayError::InvalidRequestBody(reason.clone()),
        ClientBodyError::TooLarge => GatewayError::PayloadTooLarge {
            length: None,
            limit: settings.max_body_bytes,
        },
        ClientBodyError::Timeout => GatewayError::RequestBodyTimeout {
            timeout_ms: settings.request_body_timeout.as_millis() as u64,
        },
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

    #[test]
    fn the_bits_of_connection_and_transfer_encoding_name_them() {
        assert_eq!(
            HOP_BY_HOP[CONNECTION_BIT.trailing_zeros() as usize],
            header::CONNECTION
        );
        assert_eq!(
            HOP_BY_HOP[TRANSFER_ENCODING_BIT.trailing_zeros() as usize],
            header::TRANSFER_ENCODING
        );
    }

    #[test]
    fn content_length_goes_only_beside_transfer_encoding() {
        let mut chunked = HeaderMap::new();
        chunked.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        chunked.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        chunked.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        strip_hop_by_hop(&mut chunked);
        let left: Vec<_> = chunked.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["content-type"]);

        let mut sized = HeaderMap::new();
        sized.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        sized.append(header::TE, HeaderValue::from_static("trailers"));
        sized.append(header::TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut sized);
        let left: Vec<_> = sized.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["content-length"]);
    }
}
