//! How each refusal is answered and counted: its HTTP status, its `code`, the plane that answers
//! it, who caused it, the client body fault it is and its `Retry-After`. Each is one exhaustive
//! match over the variants, kept here apart from the variants and their messages, so a new
//! variant fails to compile until every one of them is decided.

use bch_core::admission::SHED_ERROR_CODE;
use http::StatusCode;

use super::{ClientBodyFault, GatewayError, Plane, Source};

impl GatewayError {
    /// The HTTP status this refusal is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::PayloadTooLarge { .. } | GatewayError::ControlBodyTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            GatewayError::IncompleteRequestBody
            | GatewayError::InvalidRequestBody(_)
            | GatewayError::MissingHost
            | GatewayError::MissingControlHost
            | GatewayError::ModelRequired(_)
            | GatewayError::RepeatedHeader(_) => StatusCode::BAD_REQUEST,
            GatewayError::TooManyHeaders { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::RequestBodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            GatewayError::TunnelNotSupported | GatewayError::MethodNotAllowed => {
                StatusCode::METHOD_NOT_ALLOWED
            }
            GatewayError::LoopDetected => StatusCode::LOOP_DETECTED,
            GatewayError::HostNotAllowed(_) | GatewayError::OriginNotAllowed(_) => {
                StatusCode::FORBIDDEN
            }
            GatewayError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            GatewayError::WorkerBadResponse { .. } | GatewayError::UpstreamBodyBroken(_) => {
                StatusCode::BAD_GATEWAY
            }
            GatewayError::NoHealthyWorkers
            | GatewayError::NoWorkers
            | GatewayError::TargetWorkerMiss
            | GatewayError::Shed { .. }
            | GatewayError::TooManyConnections
            | GatewayError::PickerUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::WorkerGone(_)
            | GatewayError::BadUpstreamUri(_)
            | GatewayError::WorkerUnreachable(_)
            | GatewayError::WorkerTls(..)
            | GatewayError::UpstreamStreamError => StatusCode::BAD_GATEWAY,
            GatewayError::FirstByteTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::NotFound
            | GatewayError::UnknownWorker(_)
            | GatewayError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
            GatewayError::InvalidJson(_)
            | GatewayError::InvalidWorker(_)
            | GatewayError::InvalidPolicy(_)
            | GatewayError::InvalidQuery(_)
            | GatewayError::InvalidRoutingKey(_)
            | GatewayError::InvalidConfig(_) => StatusCode::BAD_REQUEST,
            GatewayError::WorkerConflict(_)
            | GatewayError::DiscoveredWorker(_)
            | GatewayError::NoConfigFile(_) => StatusCode::CONFLICT,
            GatewayError::ConfigNotRendered(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable, machine-readable `code` of the OpenAI error body.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::PayloadTooLarge { .. } | GatewayError::ControlBodyTooLarge { .. } => {
                "payload_too_large"
            }
            GatewayError::WorkerBadResponse { .. } => "invalid_worker_response",
            GatewayError::UpstreamBodyBroken(_) => "upstream_stream_error",
            GatewayError::IncompleteRequestBody => "incomplete_request_body",
            GatewayError::InvalidRequestBody(_) => "invalid_request_body",
            GatewayError::RequestBodyTimeout { .. } => "request_body_timeout",
            GatewayError::MissingHost | GatewayError::MissingControlHost => "missing_host",
            GatewayError::RepeatedHeader(_) => "repeated_header",
            GatewayError::TooManyHeaders { .. } => "too_many_headers",
            GatewayError::TunnelNotSupported | GatewayError::MethodNotAllowed => {
                "method_not_allowed"
            }
            GatewayError::LoopDetected => "loop_detected",
            GatewayError::HostNotAllowed(_) => "host_not_allowed",
            GatewayError::OriginNotAllowed(_) => "origin_not_allowed",
            GatewayError::UnsupportedMediaType => "unsupported_media_type",
            // One code for both: a client's handling is the same, the message tells them apart.
            GatewayError::NoHealthyWorkers | GatewayError::NoWorkers => "no_healthy_workers",
            GatewayError::TargetWorkerMiss => "target_worker_miss",
            GatewayError::ModelNotFound(_) => "model_not_found",
            GatewayError::ModelRequired(_) => "model_required",
            GatewayError::WorkerGone(_) | GatewayError::BadUpstreamUri(_) => "bad_worker_url",
            GatewayError::WorkerUnreachable(_) | GatewayError::WorkerTls(..) => {
                "worker_unreachable"
            }
            GatewayError::FirstByteTimeout { .. } => "first_byte_timeout",
            GatewayError::Shed { .. } => SHED_ERROR_CODE,
            GatewayError::TooManyConnections => "too_many_connections",
            GatewayError::PickerUnavailable => "picker_unavailable",
            GatewayError::UpstreamStreamError => "upstream_stream_error",
            GatewayError::NotFound => "not_found",
            GatewayError::Unauthorized => "unauthorized",
            GatewayError::InvalidJson(_) => "invalid_json",
            GatewayError::InvalidWorker(_) => "invalid_worker",
            GatewayError::WorkerConflict(_) => "worker_conflict",
            GatewayError::DiscoveredWorker(_) => "worker_discovered",
            GatewayError::UnknownWorker(_) => "unknown_worker",
            GatewayError::InvalidPolicy(_) => "invalid_policy",
            GatewayError::InvalidQuery(_) => "invalid_query",
            GatewayError::InvalidRoutingKey(_) => "invalid_routing_key",
            GatewayError::NoConfigFile(_) => "no_config_file",
            GatewayError::InvalidConfig(_) => "invalid_config",
            GatewayError::ConfigNotRendered(_) => "config_not_rendered",
        }
    }

    /// The OpenAI `type`: `gateway_error` for data plane refusals, `control_error` for control
    /// plane ones.
    pub fn error_type(&self) -> &'static str {
        self.plane().error_type()
    }

    /// The listener that answers this refusal.
    pub fn plane(&self) -> Plane {
        match self {
            GatewayError::PayloadTooLarge { .. }
            | GatewayError::NoHealthyWorkers
            | GatewayError::NoWorkers
            | GatewayError::TargetWorkerMiss
            | GatewayError::ModelNotFound(_)
            | GatewayError::ModelRequired(_)
            | GatewayError::WorkerGone(_)
            | GatewayError::BadUpstreamUri(_)
            | GatewayError::WorkerUnreachable(_)
            | GatewayError::WorkerTls(..)
            | GatewayError::WorkerBadResponse { .. }
            | GatewayError::UpstreamBodyBroken(_)
            | GatewayError::IncompleteRequestBody
            | GatewayError::InvalidRequestBody(_)
            | GatewayError::RequestBodyTimeout { .. }
            | GatewayError::MissingHost
            | GatewayError::RepeatedHeader(_)
            | GatewayError::TooManyHeaders { .. }
            | GatewayError::TunnelNotSupported
            | GatewayError::LoopDetected
            | GatewayError::FirstByteTimeout { .. }
            | GatewayError::Shed { .. }
            | GatewayError::TooManyConnections
            | GatewayError::PickerUnavailable
            | GatewayError::UpstreamStreamError => Plane::Data,
            GatewayError::MissingControlHost
            | GatewayError::NotFound
            | GatewayError::Unauthorized
            | GatewayError::HostNotAllowed(_)
            | GatewayError::OriginNotAllowed(_)
            | GatewayError::UnsupportedMediaType
            | GatewayError::MethodNotAllowed
            | GatewayError::ControlBodyTooLarge { .. }
            | GatewayError::InvalidJson(_)
            | GatewayError::InvalidWorker(_)
            | GatewayError::WorkerConflict(_)
            | GatewayError::DiscoveredWorker(_)
            | GatewayError::UnknownWorker(_)
            | GatewayError::InvalidPolicy(_)
            | GatewayError::InvalidQuery(_)
            | GatewayError::InvalidRoutingKey(_)
            | GatewayError::NoConfigFile(_)
            | GatewayError::InvalidConfig(_)
            | GatewayError::ConfigNotRendered(_) => Plane::Control,
        }
    }

    /// Who caused this refusal. A client's refusal is never counted against a worker; a worker's
    /// is (its error counter, passive health).
    pub fn caused_by(&self) -> Source {
        match self {
            GatewayError::PayloadTooLarge { .. }
            | GatewayError::TargetWorkerMiss
            | GatewayError::ModelNotFound(_)
            | GatewayError::ModelRequired(_)
            | GatewayError::IncompleteRequestBody
            | GatewayError::InvalidRequestBody(_)
            | GatewayError::RequestBodyTimeout { .. }
            | GatewayError::MissingHost
            | GatewayError::RepeatedHeader(_)
            | GatewayError::TooManyHeaders { .. }
            | GatewayError::TunnelNotSupported
            | GatewayError::MissingControlHost
            | GatewayError::NotFound
            | GatewayError::Unauthorized
            | GatewayError::HostNotAllowed(_)
            | GatewayError::OriginNotAllowed(_)
            | GatewayError::UnsupportedMediaType
            | GatewayError::MethodNotAllowed
            | GatewayError::ControlBodyTooLarge { .. }
            | GatewayError::InvalidJson(_)
            | GatewayError::InvalidWorker(_)
            | GatewayError::WorkerConflict(_)
            | GatewayError::DiscoveredWorker(_)
            | GatewayError::UnknownWorker(_)
            | GatewayError::InvalidPolicy(_)
            | GatewayError::InvalidQuery(_)
            | GatewayError::InvalidRoutingKey(_)
            | GatewayError::NoConfigFile(_)
            | GatewayError::InvalidConfig(_) => Source::Client,
            GatewayError::NoHealthyWorkers
            | GatewayError::WorkerUnreachable(_)
            | GatewayError::WorkerTls(..)
            | GatewayError::WorkerBadResponse { .. }
            | GatewayError::UpstreamBodyBroken(_)
            | GatewayError::FirstByteTimeout { .. }
            | GatewayError::UpstreamStreamError => Source::Worker,
            GatewayError::NoWorkers
            | GatewayError::WorkerGone(_)
            | GatewayError::BadUpstreamUri(_)
            | GatewayError::LoopDetected
            | GatewayError::Shed { .. }
            | GatewayError::TooManyConnections
            | GatewayError::PickerUnavailable
            | GatewayError::ConfigNotRendered(_) => Source::Gateway,
        }
    }

    /// The client body fault this refusal answers, when it answers one: counted in
    /// `bch_client_body_errors_total` and logged as the request's `client_fault`.
    pub fn client_body_fault(&self) -> Option<ClientBodyFault> {
        match self {
            GatewayError::PayloadTooLarge { .. } => Some(ClientBodyFault::TooLarge),
            GatewayError::IncompleteRequestBody => Some(ClientBodyFault::Incomplete),
            GatewayError::InvalidRequestBody(_) => Some(ClientBodyFault::Malformed),
            GatewayError::RequestBodyTimeout { .. } => Some(ClientBodyFault::Timeout),
            _ => None,
        }
    }

    /// The `Retry-After` value (whole seconds) of a shed request (whose `X-SMG-Error-Code` is
    /// [`SHED_ERROR_CODE`]); `None` for every other refusal.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            GatewayError::Shed {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        }
    }
}
