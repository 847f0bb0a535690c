//! Control plane refusals: a [`GatewayError`] answers with its status and OpenAI error body, so a
//! handler returns `Result<_, GatewayError>` and never builds an error response itself.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::GatewayError;

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status(),
            [(header::CONTENT_TYPE, "application/json")],
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
