//! A request's routing key and declared body size, read from its headers the same way whichever
//! front end received it: hyper's `HeaderMap` on the data plane, Envoy's header list on the
//! endpoint picker. Both go through [`HeaderLookup`], so the precedence, the explicit key's limits
//! and the implicit keys' redaction (bch-core's `routing_key`) cannot differ between them.

use bch_core::routing_key::{self, RoutingHeaders};
use http::header::{self, HeaderMap, HeaderValue};

/// Read access to a request's headers by lower-case name.
pub trait HeaderLookup {
    /// The first value of the header called `name` (lower case), as raw bytes.
    fn first(&self, name: &str) -> Option<&[u8]>;
}

impl HeaderLookup for HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(HeaderValue::as_bytes)
    }
}

/// The routing key of a request with `headers`, borrowed from them, by the configured header names.
pub fn extract_key<'a, H: HeaderLookup + ?Sized>(
    routing_headers: &RoutingHeaders,
    headers: &'a H,
) -> routing_key::Extracted<'a> {
    routing_key::extract(routing_headers, |name| headers.first(name))
}

/// The declared `Content-Length`, when there is a valid one.
pub fn content_length<H: HeaderLookup + ?Sized>(headers: &H) -> Option<u64> {
    std::str::from_utf8(headers.first(header::CONTENT_LENGTH.as_str())?)
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_core::routing_key::RoutingKey;

    #[test]
    fn header_maps_give_the_first_value_and_the_declared_length() {
        let mut headers = HeaderMap::new();
        headers.append("x-smg-routing-key", HeaderValue::from_static("first"));
        headers.append("x-smg-routing-key", HeaderValue::from_static("second"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("42"));
        let key = extract_key(&RoutingHeaders::default(), &headers).key;
        assert!(matches!(key, RoutingKey::Explicit(k) if k.as_str() == "first"));
        assert_eq!(content_length(&headers), Some(42));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("-1"));
        assert_eq!(content_length(&headers), None);
    }
}
