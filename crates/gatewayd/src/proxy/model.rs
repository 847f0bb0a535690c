//! The request's model and body key, read before routing: from the `x-gateway-model-name` header
//! (what the Gateway API Inference Extension's body-based routing sets), else from the JSON
//! body's top-level `model`, scanned as the body arrives ([`BodyScanner`]) and only as far as
//! needed; what was read is kept and sent to the worker first, unchanged, followed by the rest.
//!
//! The body is read only when routing needs it: with workers serving two or more models, or with
//! `[routing] key_from_rid` on. A fleet with one model (or none) routes every request to its one
//! pool and streams the body untouched, as before models existed.
//!
//! Also `GET /v1/models` on a fleet with models: the union of the pools' models, answered by the
//! gateway in OpenAI's list shape.

use std::sync::Arc;

use bch_core::request_body::{BodyFields, BodyScanner, Progress, WantedFields, rid_lineage_root};
use bch_core::router::RoutingTable;
use bytes::Bytes;
use http::{HeaderMap, Method};

use super::request::client_refusal;
use crate::config::runtime::RuntimeSettings;
use crate::error::GatewayError;
use crate::routing::RouteBy;
use crate::routing::key::content_length;
use crate::upstream::UpstreamBody;

/// The header naming a request's model ahead of its body: it wins over the body's `model`.
pub const MODEL_HEADER: &str = "x-gateway-model-name";

/// What routing needs of this request beyond its headers: its model when the fleet has two or
/// more models, and its `rid` key when `key_from_rid` is on, reading `body` ahead as far as
/// needed. A request that names no model gets the default model, or
/// [`GatewayError::ModelRequired`]; a body fault is the client's refusal.
pub async fn route_by(
    table: &RoutingTable,
    settings: &RuntimeSettings,
    method: &Method,
    headers: &HeaderMap,
    body: &mut UpstreamBody,
) -> Result<RouteBy, GatewayError> {
    let by_model = table.pools().len() > 1;
    let header_model = headers
        .get(MODEL_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|model| !model.is_empty());
    let wanted = WantedFields {
        model: by_model && header_model.is_none(),
        rid: settings.key_from_rid,
    };
    let fields = if !wanted.model && !wanted.rid {
        Ok(BodyFields::default())
    } else if content_length(headers).is_some_and(|length| length > settings.max_body_bytes) {
        // Refused as too large by the routing step, unread.
        return Ok(RouteBy::default());
    } else {
        read_fields(method, body, wanted)
            .await
            .map_err(|fault| client_refusal(settings, &fault))?
    };
    let (found, problem) = match fields {
        Ok(fields) => (fields, None),
        Err(problem) => (BodyFields::default(), Some(problem.to_string())),
    };
    let model = match (by_model, header_model, found.model) {
        (false, _, _) => None,
        (true, Some(model), _) => Some(Arc::from(model)),
        (true, None, Some(model)) => Some(Arc::from(model)),
        (true, None, None) => match &settings.default_model {
            Some(default) => Some(Arc::clone(default)),
            None => {
                let why = problem.unwrap_or_else(|| "the body has no \"model\" field".into());
                return Err(GatewayError::ModelRequired(why));
            }
        },
    };
    Ok(RouteBy {
        model,
        rid_key: found.rid.map(|rid| rid_lineage_root(&rid).into()),
    })
}

/// Scans `body` for the wanted fields, reading it ahead until they are known.
async fn read_fields(
    method: &Method,
    body: &mut UpstreamBody,
    wanted: WantedFields,
) -> Result<Result<BodyFields, bch_core::request_body::BodyProblem>, crate::upstream::ClientBodyError>
{
    let mut scanner = BodyScanner::new(wanted);
    if method != Method::GET && method != Method::HEAD {
        body.read_ahead(|chunk| scanner.feed(chunk) == Progress::Answered)
            .await?;
    }
    Ok(scanner.finish())
}

/// `GET /v1/models` of a fleet with models: every pool's model, sorted, in OpenAI's list shape.
/// `None` for a fleet without models (the request is proxied to a worker then).
pub fn model_list(table: &RoutingTable) -> Option<Bytes> {
    if !table.has_models() {
        return None;
    }
    let data: Vec<serde_json::Value> = table
        .pools()
        .iter()
        .filter_map(|pool| pool.model())
        .map(|model| {
            serde_json::json!({"id": &**model, "object": "model", "created": 0, "owned_by": "bch"})
        })
        .collect();
    let list = serde_json::json!({"object": "list", "data": data});
    Some(Bytes::from(list.to_string()))
}
