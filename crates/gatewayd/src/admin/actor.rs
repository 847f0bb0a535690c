//! Who asks the admin owner for a change, so the log and the telemetry frame can name them.

use bch_core::telemetry::ChangeSource;

/// Who asks for a change: the channel (`ws`, `http`, `reload`, `discovery`, `drain`) and, for the
/// first two, the client's address, so the log and the telemetry frame can name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The channel the change came through.
    pub source: ChangeSource,
    /// The peer address of the client (`None` for a change the gateway makes itself or an
    /// unknown peer).
    pub client: Option<String>,
}

impl Actor {
    /// A change made by a configuration reload (SIGHUP or `POST /admin/reload`): no client to
    /// name.
    pub fn reload() -> Self {
        Self::gateway(ChangeSource::Reload)
    }

    /// A change made by a DNS discovery source's answer.
    pub fn discovery() -> Self {
        Self::gateway(ChangeSource::Discovery)
    }

    /// The removal of a drained worker once idle, as its drain asked.
    pub fn drain() -> Self {
        Self::gateway(ChangeSource::Drain)
    }

    /// A change the gateway makes itself, through `source`.
    fn gateway(source: ChangeSource) -> Self {
        Actor {
            source,
            client: None,
        }
    }

    /// A change made through `source` by the client at `client`.
    pub fn client(source: ChangeSource, client: Option<std::net::SocketAddr>) -> Self {
        Actor {
            source,
            client: client.map(|a| a.to_string()),
        }
    }

    /// The client's address for a log line, `-` when there is none.
    pub fn client_str(&self) -> &str {
        self.client.as_deref().unwrap_or("-")
    }
}
