//! `[server]`, grouped by role: where gatewayd listens, who may use its control plane, how much
//! it accepts, and how long it waits. The file keeps one flat table (`[server] listen = …`,
//! `first_byte_timeout_ms = …`): [`ServerKeys`] is that table, converted to and from the groups.
//!
//! Why a flat mirror and not `#[serde(flatten)]` on the groups: serde buffers flattened fields,
//! so toml's errors then point at the `[server]` header instead of the key, and a wrong type
//! (`listen = "nowhere"`) no longer names its field. The mirror keeps `deny_unknown_fields` and
//! toml's line, column and key in every message.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::field_error::FieldError;
use super::sections::{zero_counts, zero_durations};
use super::tls::ListenerTls;

/// Default `[server] upstream_idle_timeout_ms`: below the 5 s after which uvicorn-based engines
/// (vLLM, SGLang) close idle keep-alive connections. A request sent on a connection the worker is
/// closing at that very moment fails after it was written, when it can no longer be proven unsent
/// and so cannot be retried; retiring connections first keeps that race from happening.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_millis(4_000);

/// `[server]`: listeners, control access, limits and timeouts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(from = "ServerKeys", into = "ServerKeys")]
pub struct ServerConfig {
    /// Where gatewayd listens, and whether it serves the data plane.
    pub listeners: Listeners,
    /// Who may use the control plane.
    pub control_access: ControlAccess,
    /// How much the data plane accepts.
    pub limits: Limits,
    /// How long gatewayd waits for clients and workers.
    pub timeouts: Timeouts,
    /// `[server.tls]`: TLS on the data plane, and on the control plane and the picker unless
    /// `[control.tls]` / `[picker.tls]` override it; `None` = plain HTTP.
    pub tls: Option<ListenerTls>,
}

/// Where gatewayd listens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Listeners {
    /// `listen`: data plane address.
    pub listen: SocketAddr,
    /// `control_listen`: control plane address (metrics, admin API, websocket).
    pub control_listen: SocketAddr,
    /// `data_plane`: serve the data plane on `listen`. `false` runs gatewayd as Envoy's endpoint
    /// picker only (needs `[picker] listen`); the control plane runs either way.
    pub data_plane: bool,
}

impl Default for Listeners {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("valid"),
            control_listen: "127.0.0.1:9090".parse().expect("valid"),
            data_plane: true,
        }
    }
}

/// Who may use the control plane.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControlAccess {
    /// `admin_token_file`: file holding the bearer token for the control plane; unset = no auth
    /// (loopback only).
    pub admin_token_file: Option<PathBuf>,
    /// `metrics_token_file`: file holding a second bearer token that opens `GET /metrics` and a
    /// read-only `GET /ws` (its write commands refused) and nothing else, for the scraper and
    /// watch-only consoles, which then never hold the token that can rewrite routing.
    /// Needs `admin_token_file`.
    pub metrics_token_file: Option<PathBuf>,
    /// `control_allowed_hosts`: names (without port) a tokenless control plane answers to in
    /// `Host`, besides its listen address and `localhost`: a browser page whose name resolves to
    /// loopback (DNS rebinding) is refused. Ignored when `admin_token_file` is set.
    pub allowed_hosts: Vec<String>,
    /// `control_allowed_origins`: browser origins (`http://host:port`) whose pages may use the
    /// control plane (a websocket console, say). Requests from any other page are refused; clients
    /// that are not browsers send no `Origin` and are not affected.
    pub allowed_origins: Vec<String>,
}

/// How much the data plane accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// `max_body_bytes`: largest request body accepted, bytes; larger gets 413.
    pub max_body_bytes: u64,
    /// `max_connections`: most concurrent data plane connections; beyond it new connections get
    /// a 503 and are closed.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            max_connections: 10_000,
        }
    }
}

/// How long gatewayd waits. Each field is one `[server]` key: its name, then `_timeout_ms`
/// (`header_read` is `header_read_timeout_ms`), except `shutdown_grace` (`shutdown_grace_ms`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// Time a client has to send its request headers (slow-loris protection).
    pub header_read: Duration,
    /// Time to connect to a worker; a failed connect is retried once on the next worker.
    pub connect: Duration,
    /// Time the worker has to send response headers; then 504. LLM prefill of a long prompt on
    /// a busy worker can take a while, so the default is generous.
    pub first_byte: Duration,
    /// Longest silence between two chunks of a streamed response body; then the stream is ended
    /// (with an SSE error event for event streams).
    pub stream_idle: Duration,
    /// On SIGTERM/SIGINT, how long in-flight streams may run before the process exits.
    pub shutdown_grace: Duration,
    /// Time a client has to send its whole request body, counted from its request head; then
    /// 408. Without it a 1 byte/s upload would hold a worker's in-flight load (and steer the
    /// bounded policy's spills) until the first-byte timeout.
    pub request_body: Duration,
    /// Longest time a client may leave the gateway's writes to it blocked (it does not read its
    /// response); then its connection is closed and the worker's request cancelled. A stream held
    /// by a client that stopped reading is not idle, so `stream_idle` never ends it.
    pub client_stall: Duration,
    /// How long a keep-alive connection to a worker may sit unused before it is closed instead
    /// of reused. Must be below the workers' own idle timeout (uvicorn-based engines close after
    /// 5 s), or a request can meet a connection the worker is closing at that very moment.
    pub upstream_idle: Duration,
    /// `tls_handshake_timeout_ms`: time a client has to complete its TLS handshake on a TLS
    /// listener, counted from the accept; then the connection is closed (and its
    /// `max_connections` slot freed). Separate from `header_read` because a handshake needs
    /// round trips and CPU the header read does not.
    pub tls_handshake: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_millis(10_000),
            connect: Duration::from_millis(2_000),
            first_byte: Duration::from_millis(300_000),
            stream_idle: Duration::from_millis(300_000),
            shutdown_grace: Duration::from_millis(30_000),
            request_body: Duration::from_millis(60_000),
            client_stall: Duration::from_millis(60_000),
            upstream_idle: DEFAULT_UPSTREAM_IDLE_TIMEOUT,
            tls_handshake: Duration::from_millis(10_000),
        }
    }
}

impl Timeouts {
    /// The timeouts that must be greater than zero, with their keys: all but `shutdown_grace`
    /// (0 = exit at once).
    fn required(&self) -> [(&'static str, Duration); 8] {
        [
            ("header_read_timeout_ms", self.header_read),
            ("connect_timeout_ms", self.connect),
            ("first_byte_timeout_ms", self.first_byte),
            ("stream_idle_timeout_ms", self.stream_idle),
            ("request_body_timeout_ms", self.request_body),
            ("client_stall_timeout_ms", self.client_stall),
            ("upstream_idle_timeout_ms", self.upstream_idle),
            ("tls_handshake_timeout_ms", self.tls_handshake),
        ]
    }
}

impl ServerConfig {
    /// Why the two listeners cannot both be bound, when they cannot: the same port (other than 0,
    /// which gets a free port each) on the same address, or on any address when one of them
    /// listens on all of them.
    pub fn listeners_clash(&self) -> Option<String> {
        let (data, control) = (self.listeners.listen, self.listeners.control_listen);
        let overlap = data.ip() == control.ip()
            || data.ip().is_unspecified()
            || control.ip().is_unspecified();
        (data.port() != 0 && data.port() == control.port() && overlap).then(|| {
            format!("{control} and server.listen {data} cannot both be bound: give the control plane its own port")
        })
    }
}

impl ServerConfig {
    /// Every problem of `[server]`, each naming its key: a zero timeout or connection limit,
    /// listeners that cannot both be bound, a metrics token without an admin token, an allowed
    /// host or origin that is not one.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = zero_durations(self.timeouts.required());
        problems.extend(zero_counts([(
            "max_connections",
            self.limits.max_connections as u64,
        )]));
        if let Some(clash) = self.listeners_clash() {
            problems.push(FieldError::new("control_listen", clash));
        }
        let access = &self.control_access;
        if access.metrics_token_file.is_some() && access.admin_token_file.is_none() {
            problems.push(FieldError::new(
                "metrics_token_file",
                "needs server.admin_token_file: without it the control plane is open and a metrics token protects nothing",
            ));
        }
        for (index, host) in access.allowed_hosts.iter().enumerate() {
            if host.is_empty() || host.contains(['/', ' ', '@']) {
                problems.push(FieldError::new(
                    format!("control_allowed_hosts[{index}]"),
                    format!("{host:?} is not a host name (write it without scheme or path)"),
                ));
            }
        }
        for (index, origin) in access.allowed_origins.iter().enumerate() {
            if !is_origin(origin) {
                problems.push(FieldError::new(
                    format!("control_allowed_origins[{index}]"),
                    format!("{origin:?} is not an origin: write scheme://host[:port], no path"),
                ));
            }
        }
        if let Some(tls) = &self.tls {
            problems.extend(tls.problems().into_iter().map(|e| e.within("tls")));
        }
        problems
    }
}

/// `scheme://host[:port]` as a browser sends it in `Origin`.
fn is_origin(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !rest.trim_end_matches('/').is_empty()
        && !rest
            .trim_end_matches('/')
            .contains(['/', '?', '#', '@', ' '])
}

/// The `[server]` table as written in the file, one field per documented key
/// (docs/configuration.md), in the order `GET /admin/config` prints them. Only the conversions
/// read it: the code reads [`ServerConfig`]'s groups.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerKeys {
    listen: SocketAddr,
    control_listen: SocketAddr,
    admin_token_file: Option<PathBuf>,
    metrics_token_file: Option<PathBuf>,
    max_body_bytes: u64,
    max_connections: usize,
    #[serde(with = "super::millis")]
    header_read_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    connect_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    first_byte_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    stream_idle_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    shutdown_grace_ms: Duration,
    #[serde(with = "super::millis")]
    request_body_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    client_stall_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    upstream_idle_timeout_ms: Duration,
    #[serde(with = "super::millis")]
    tls_handshake_timeout_ms: Duration,
    control_allowed_hosts: Vec<String>,
    control_allowed_origins: Vec<String>,
    data_plane: bool,
    /// A table: written after every plain key.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<ListenerTls>,
}

impl Default for ServerKeys {
    fn default() -> Self {
        ServerConfig::default().into()
    }
}

impl From<ServerKeys> for ServerConfig {
    fn from(keys: ServerKeys) -> Self {
        Self {
            listeners: Listeners {
                listen: keys.listen,
                control_listen: keys.control_listen,
                data_plane: keys.data_plane,
            },
            control_access: ControlAccess {
                admin_token_file: keys.admin_token_file,
                metrics_token_file: keys.metrics_token_file,
                allowed_hosts: keys.control_allowed_hosts,
                allowed_origins: keys.control_allowed_origins,
            },
            limits: Limits {
                max_body_bytes: keys.max_body_bytes,
                max_connections: keys.max_connections,
            },
            timeouts: Timeouts {
                header_read: keys.header_read_timeout_ms,
                connect: keys.connect_timeout_ms,
                first_byte: keys.first_byte_timeout_ms,
                stream_idle: keys.stream_idle_timeout_ms,
                shutdown_grace: keys.shutdown_grace_ms,
                request_body: keys.request_body_timeout_ms,
                client_stall: keys.client_stall_timeout_ms,
                upstream_idle: keys.upstream_idle_timeout_ms,
                tls_handshake: keys.tls_handshake_timeout_ms,
            },
            tls: keys.tls,
        }
    }
}

impl From<ServerConfig> for ServerKeys {
    fn from(server: ServerConfig) -> Self {
        let ServerConfig {
            listeners,
            control_access,
            limits,
            timeouts,
            tls,
        } = server;
        Self {
            listen: listeners.listen,
            control_listen: listeners.control_listen,
            admin_token_file: control_access.admin_token_file,
            metrics_token_file: control_access.metrics_token_file,
            max_body_bytes: limits.max_body_bytes,
            max_connections: limits.max_connections,
            header_read_timeout_ms: timeouts.header_read,
            connect_timeout_ms: timeouts.connect,
            first_byte_timeout_ms: timeouts.first_byte,
            stream_idle_timeout_ms: timeouts.stream_idle,
            shutdown_grace_ms: timeouts.shutdown_grace,
            request_body_timeout_ms: timeouts.request_body,
            client_stall_timeout_ms: timeouts.client_stall,
            upstream_idle_timeout_ms: timeouts.upstream_idle,
            tls_handshake_timeout_ms: timeouts.tls_handshake,
            control_allowed_hosts: control_access.allowed_hosts,
            control_allowed_origins: control_access.allowed_origins,
            data_plane: listeners.data_plane,
            tls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flat_table_keeps_every_key_and_toml_names_the_bad_one() {
        let text = "listen = \"127.0.0.1:1\"\nfirst_byte_timeout_ms = 250\nshutdown_grace_ms = 0\n\
                    control_allowed_hosts = [\"gw\"]\nmax_connections = 7\n";
        let server: ServerConfig = toml::from_str(text).unwrap();
        assert_eq!(server.listeners.listen.port(), 1);
        assert_eq!(server.timeouts.first_byte, Duration::from_millis(250));
        assert_eq!(server.timeouts.shutdown_grace, Duration::ZERO);
        assert_eq!(server.control_access.allowed_hosts, ["gw"]);
        assert_eq!(server.limits.max_connections, 7);
        let written = toml::to_string(&server).unwrap();
        assert!(
            written.contains("first_byte_timeout_ms = 250\n"),
            "{written}"
        );
        assert_eq!(toml::from_str::<ServerConfig>(&written).unwrap(), server);
        for (text, key) in [
            ("listen_on = 1\n", "listen_on"),
            ("connect_timeout_ms = -1\n", "connect_timeout_ms"),
            ("max_connections = \"many\"\n", "max_connections"),
        ] {
            let text = format!("data_plane = true\n{text}");
            let err = toml::from_str::<ServerConfig>(&text)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(key) && err.contains("line 2"),
                "{text:?}: {err}"
            );
        }
    }
}
