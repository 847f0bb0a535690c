//! What a request's body adds to its headers for routing: the model it names, which picks the
//! pool (each model has its own ring and bounded rule), and the routing key from its `rid`.
//! The data plane reads them from the body; the endpoint picker routes in its one pool and
//! passes [`RouteBy::default`].

use std::sync::Arc;

use bch_core::router::{PoolId, RoutingTable};
use bch_core::routing_key::{ExplicitKey, Extracted, RoutingHeaders, RoutingKey};

use super::key::{HeaderLookup, extract_key};
use crate::error::GatewayError;

/// A request's model and body key; empty for a request routed by its headers alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteBy {
    /// The model the request names (body `model`, the model header or the default model);
    /// `None` routes in the first pool, the only one of a fleet without models.
    pub model: Option<Arc<str>>,
    /// The body's `rid` without its lineage suffixes, when `[routing] key_from_rid` is on.
    pub rid_key: Option<Box<str>>,
}

impl RouteBy {
    /// The pool of the request's model in `table`: [`GatewayError::ModelNotFound`] when no worker
    /// of the table serves it.
    pub fn pool(&self, table: &RoutingTable) -> Result<PoolId, GatewayError> {
        match &self.model {
            None => Ok(PoolId::FIRST),
            Some(model) => table
                .pool_of_model(model)
                .ok_or_else(|| GatewayError::ModelNotFound(model.to_string())),
        }
    }

    /// The request's routing key: the target-worker header first, then the body's `rid` (when
    /// it is in the explicit key grammar), then the headers' keys as [`extract_key`] reads them.
    /// A `rid` that is no valid key is passed over as if absent.
    pub fn key<'a, H: HeaderLookup + ?Sized>(
        &'a self,
        routing_headers: &RoutingHeaders,
        headers: &'a H,
    ) -> Extracted<'a> {
        let extracted = extract_key(routing_headers, headers);
        if matches!(extracted.key, RoutingKey::Target(_)) {
            return extracted;
        }
        match self
            .rid_key
            .as_deref()
            .map(|rid| ExplicitKey::parse(rid.as_bytes()))
        {
            Some(Ok(key)) => Extracted {
                key: RoutingKey::Explicit(key),
                ignored_explicit: None,
            },
            _ => extracted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use http::header::HeaderValue;

    #[test]
    fn the_rid_key_comes_after_the_target_worker_and_before_the_routing_key_header() {
        let headers_with = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            headers
        };
        let by = RouteBy {
            model: None,
            rid_key: Some("conv9".into()),
        };
        let names = RoutingHeaders::default();
        let headers = headers_with(&[("x-smg-routing-key", "other"), ("authorization", "t")]);
        let key = by.key(&names, &headers).key;
        assert!(matches!(key, RoutingKey::Explicit(k) if k.as_str() == "conv9"));
        let pinned = headers_with(&[("x-smg-target-worker", "0"), ("x-smg-routing-key", "k")]);
        assert!(matches!(by.key(&names, &pinned).key, RoutingKey::Target(_)));
        let unusable = RouteBy {
            model: None,
            rid_key: Some(" spaced".into()),
        };
        let key = unusable.key(&names, &headers).key;
        assert!(matches!(key, RoutingKey::Explicit(k) if k.as_str() == "other"));
    }
}
