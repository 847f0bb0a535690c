//! Control plane refusals: a [`GatewayError`] answers with its status, OpenAI error body and
//! `x-smg-error-code`, so a handler returns `Result<_, GatewayError>` and never builds an error
//! response itself.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::{ERROR_CODE_HEADER_NAME, GatewayError};

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status(),
            [
                (header::CONTENT_TYPE, "application/json"),
                (
                    HeaderName::from_static(ERROR_CODE_HEADER_NAME),
                    self.smg_error_code(),
                ),
            ],
            self.body(),
        )
            .into_response();
        if self == GatewayError::Unauthorized {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
