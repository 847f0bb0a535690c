//! The ext_proc messages of the Gateway API Inference Extension's endpoint-picker protocol, as
//! bch answers them: reading Envoy's request (headers, the endpoint it served from), and building
//! the picker's responses (the pick, the `x-bch-*` response headers, an OpenAI-shaped refusal,
//! and the plain "continue" the protocol asks for every other message).
//!
//! Names come from the protocol: the header and the `envoy.lb` dynamic-metadata key
//! `x-gateway-destination-endpoint` carry the picked endpoints (`IP:PORT,IP:PORT,…`), and Envoy
//! reports the one it served from under `envoy.lb` / `x-gateway-destination-endpoint-served`
//! (its `override_host` load balancer's `selected_host_key`).

use std::collections::HashMap;
use std::net::SocketAddr;

use bch_core::policy::Branch;
use bch_core::routing_key::{BRANCH_HEADER, WORKER_HEADER};
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders, ImmediateResponse,
    ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

use crate::error::{ERROR_CODE_HEADER_NAME, GatewayError, QUEUE_WAIT_HEADER_NAME};
use crate::routing::HeaderLookup;

/// Request header carrying the picked endpoints, for Envoy's `override_host` policy.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Dynamic-metadata namespace of the picked and the served endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Key (under [`LB_NAMESPACE`]) of the picked endpoints.
pub const DESTINATION_KEY: &str = DESTINATION_HEADER;
/// Key (under [`LB_NAMESPACE`]) of the endpoint Envoy served the request from.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// The request header whose value the picker's log line carries as the request's id: Envoy's
/// own (generated, or the client's kept), so one id follows the request through Envoy's, the
/// picker's and the worker's logs.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

impl HeaderLookup for HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        // Envoy sends lower-case names, and the value in `raw_value` (older versions: `value`).
        self.headers.iter().find(|h| h.key == name).map(|h| {
            if h.raw_value.is_empty() {
                h.value.as_bytes()
            } else {
                h.raw_value.as_slice()
            }
        })
    }
}

/// The headers of a headers message (an empty list when Envoy sent none).
pub fn headers(message: &HttpHeaders) -> &HeaderMap {
    static EMPTY: HeaderMap = HeaderMap {
        headers: Vec::new(),
    };
    message.headers.as_ref().unwrap_or(&EMPTY)
}

/// What the request's exchange takes from Envoy's request headers: `:method`, `:path` (only when
/// the request log is on) and the `x-request-id` Envoy or its client set.
pub fn head(headers: &HeaderMap) -> crate::routing::exchange::Head {
    crate::routing::exchange::Head {
        method: headers
            .first(":method")
            .and_then(|m| http::Method::from_bytes(m).ok())
            .unwrap_or_default(),
        path: crate::routing::exchange::request_log_on()
            .then(|| headers.first(":path"))
            .flatten()
            .and_then(|p| http::uri::PathAndQuery::try_from(p).ok()),
        client_id: headers
            .first(REQUEST_ID_HEADER)
            .and_then(|v| http::HeaderValue::from_bytes(v).ok()),
    }
}

/// The response's `:status`, when it is a valid status code.
pub fn status(headers: &HeaderMap) -> Option<http::StatusCode> {
    http::StatusCode::from_bytes(headers.first(":status")?).ok()
}

/// The endpoint Envoy says it served the request from, when its metadata carries one.
pub fn served_endpoint(request: &ProcessingRequest) -> Option<SocketAddr> {
    let namespace = request
        .metadata_context
        .as_ref()?
        .filter_metadata
        .get(LB_NAMESPACE)?;
    match &namespace.fields.get(SERVED_KEY)?.kind {
        Some(Kind::StringValue(text)) => text.trim().parse().ok(),
        _ => None,
    }
}

/// The answer to the request headers: continue, with `endpoints` (`IP:PORT,…`) in the request
/// header and the dynamic metadata the protocol names, both the same value.
pub fn pick(endpoints: String) -> ProcessingResponse {
    let header = header_option(DESTINATION_HEADER, endpoints.as_bytes().to_vec());
    let lb = Struct {
        fields: HashMap::from([(DESTINATION_KEY.to_owned(), string_value(endpoints))]),
    };
    let metadata = Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]),
    };
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers: vec![header],
                    remove_headers: Vec::new(),
                }),
                ..CommonResponse::default()
            }),
        })),
        dynamic_metadata: Some(metadata),
        ..ProcessingResponse::default()
    }
}

/// The answer to the response headers: continue, with `x-bch-worker` (the worker that served,
/// when known), `x-bch-branch`, and `x-bch-queue-wait-ms` when the request waited for a slot.
pub fn annotate(
    worker: Option<&str>,
    branch: Branch,
    queue_wait_ms: Option<u64>,
) -> ProcessingResponse {
    let mut set_headers = Vec::with_capacity(2 + usize::from(queue_wait_ms.is_some()));
    if let Some(waited) = queue_wait_ms {
        set_headers.push(header_option(
            QUEUE_WAIT_HEADER_NAME,
            waited.to_string().into_bytes(),
        ));
    }
    if let Some(name) = worker {
        set_headers.push(header_option(WORKER_HEADER, name.as_bytes().to_vec()));
    }
    set_headers.push(header_option(
        BRANCH_HEADER,
        branch.as_str().as_bytes().to_vec(),
    ));
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: Vec::new(),
                }),
                ..CommonResponse::default()
            }),
        })),
        ..ProcessingResponse::default()
    }
}

/// The refusal Envoy sends the client instead of proxying: the gateway's status and OpenAI error
/// body, `content-type: application/json`, `x-smg-error-code`, `x-bch-branch` when the request was
/// routed, and for a shed request `retry-after`, as the data plane answers.
pub fn refuse(error: &GatewayError, branch: Option<Branch>) -> ProcessingResponse {
    let mut set_headers = vec![header_option(
        http::header::CONTENT_TYPE.as_str(),
        b"application/json".to_vec(),
    )];
    if let Some(branch) = branch {
        set_headers.push(header_option(
            BRANCH_HEADER,
            branch.as_str().as_bytes().to_vec(),
        ));
    }
    set_headers.push(header_option(
        ERROR_CODE_HEADER_NAME,
        error.smg_error_code().as_bytes().to_vec(),
    ));
    if let Some(seconds) = error.retry_after_secs() {
        set_headers.push(header_option(
            http::header::RETRY_AFTER.as_str(),
            seconds.to_string().into_bytes(),
        ));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(error.status().as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: Vec::new(),
            }),
            body: error.body().to_vec(),
            details: error.code().to_owned(),
            ..ImmediateResponse::default()
        })),
        ..ProcessingResponse::default()
    }
}

/// "Continue unchanged", the answer to a message the picker has nothing to say about, in the
/// shape that message needs (the protocol answers every message exactly once). `None` for a
/// message that carries no part of the HTTP exchange, which gets no answer.
pub fn continue_unchanged(request: &ProcessingRequest) -> Option<ProcessingResponse> {
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
    let headers = || HeadersResponse {
        response: Some(CommonResponse::default()),
    };
    let body = || BodyResponse {
        response: Some(CommonResponse::default()),
    };
    let response = match request.request.as_ref()? {
        Request::RequestHeaders(_) => Response::RequestHeaders(headers()),
        Request::ResponseHeaders(_) => Response::ResponseHeaders(headers()),
        Request::RequestBody(_) => Response::RequestBody(body()),
        Request::ResponseBody(_) => Response::ResponseBody(body()),
        Request::RequestTrailers(_) => Response::RequestTrailers(TrailersResponse::default()),
        Request::ResponseTrailers(_) => Response::ResponseTrailers(TrailersResponse::default()),
    };
    Some(ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    })
}

fn header_option(name: &str, value: Vec<u8>) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: name.to_owned(),
            value: String::new(),
            raw_value: value,
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

fn string_value(text: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(text)),
    }
}
