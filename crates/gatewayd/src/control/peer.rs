//! [`Peer`], the axum extractor of the client's address: whom the log and telemetry name as the
//! author of a change, made over the admin API or the websocket.

/// The address of the client on the other end of the connection, when the accept loop recorded
/// it (as `ConnectInfo`): what the log and telemetry name as the author of a change.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub Option<std::net::SocketAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let info = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        Ok(Peer(info.map(|info| info.0)))
    }
}
