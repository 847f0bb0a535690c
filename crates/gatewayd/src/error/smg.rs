//! The `X-SMG-Error-Code` of each refusal: SGLang Model Gateway's (SMG) code where SMG answers the
//! same situation with one, so a client scripted against SMG reads bch's refusals unchanged;
//! otherwise the refusal's own `code`. The body's `code` stays bch's either way (its wire contract).

use bch_core::admission::SHED_ERROR_CODE;

use super::GatewayError;

impl GatewayError {
    /// The value of `X-SMG-Error-Code` on this refusal's answer: SMG's code for the same situation
    /// (`no_available_workers`, `model_not_found`, `invalid_body`, `unsupported_method`,
    /// `no_worker_response`, `worker_overload_protection_shed`), else [`GatewayError::code`].
    pub fn smg_error_code(&self) -> &'static str {
        match self {
            // SMG's HTTP router: nothing healthy (or nothing at all) to send to.
            GatewayError::NoHealthyWorkers | GatewayError::NoWorkers => "no_available_workers",
            GatewayError::ModelNotFound(_) => "model_not_found",
            // SMG's "failed to read body" answer, whatever broke the body.
            GatewayError::IncompleteRequestBody | GatewayError::InvalidRequestBody(_) => {
                "invalid_body"
            }
            GatewayError::TunnelNotSupported => "unsupported_method",
            // SMG's answer when no worker produced a response.
            GatewayError::WorkerUnreachable(_)
            | GatewayError::WorkerTls(..)
            | GatewayError::WorkerBadResponse { .. }
            | GatewayError::UpstreamBodyBroken(_) => "no_worker_response",
            GatewayError::Shed { .. } => SHED_ERROR_CODE,
            // No SMG code for these: bch's own.
            GatewayError::PayloadTooLarge { .. }
            | GatewayError::TargetWorkerMiss
            | GatewayError::ModelRequired(_)
            | GatewayError::WorkerGone(_)
            | GatewayError::BadUpstreamUri(_)
            | GatewayError::RequestBodyTimeout { .. }
            | GatewayError::MissingHost
            | GatewayError::RepeatedHeader(_)
            | GatewayError::TooManyHeaders { .. }
            | GatewayError::LoopDetected
            | GatewayError::FirstByteTimeout { .. }
            | GatewayError::TooManyConnections
            | GatewayError::PickerUnavailable
            | GatewayError::UpstreamStreamError
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
            | GatewayError::InvalidConfig(_)
            | GatewayError::ConfigNotRendered(_) => self.code(),
        }
    }
}
