//! One `[[discovery]]` entry (or `--discover-dns NAME`): a DNS name whose records are workers, and
//! how often and where to ask. What happens with the answers is in docs/discovery.md.

use std::net::SocketAddr;
use std::time::Duration;

use bch_core::router::WorkerSource;
use serde::{Deserialize, Serialize};

use super::field_error::FieldError;

/// Default time between two resolutions of one name.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5_000);
/// Default time an empty answer (NXDOMAIN, or no records) must persist before the source's
/// workers are removed.
pub const DEFAULT_EMPTY_AFTER: Duration = Duration::from_millis(30_000);
/// Default time one resolution may take before it counts as a resolver failure.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2_000);
/// Shortest `interval_ms` accepted, ms: a fleet does not change faster, and a resolver shared by
/// many gateway replicas should not be asked more often.
pub const MIN_INTERVAL_MS: u64 = 100;

/// Which records a name is resolved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsKind {
    /// SRV (`_service._proto.name`): each record names a target host and its port.
    Srv,
    /// A and AAAA: each address is a worker on the entry's `port`.
    Address,
}

/// One `[[discovery]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// The name to resolve. Beginning with `_` (`_http._tcp.llm.default.svc.cluster.local`): SRV
    /// records; otherwise A and AAAA records.
    pub dns: String,
    /// The workers' port, for A/AAAA names only (SRV records carry their own).
    #[serde(default)]
    pub port: Option<u16>,
    /// Scheme of the discovered workers' URLs, `http` or `https`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// For `https`: the name the workers' certificates are checked against. Unset: an SRV
    /// record's target name (when it stands for one worker), else the `dns` name without its
    /// leading `_service._proto.` labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// `interval_ms`: longest time between two resolutions; an answer whose TTL runs out sooner
    /// is asked again sooner (but not more often than once a second).
    #[serde(
        rename = "interval_ms",
        with = "super::millis",
        default = "default_interval"
    )]
    pub interval: Duration,
    /// The DNS server to ask, `IP:PORT`; unset: the system's (`/etc/resolv.conf`).
    #[serde(default)]
    pub resolver: Option<SocketAddr>,
    /// Health probe path of the workers this source finds; unset: `[health] path`.
    #[serde(default)]
    pub health_path: Option<String>,
    /// Where the workers this source finds serve their Prometheus text; unset: `[load]
    /// metrics_path`.
    #[serde(default)]
    pub metrics_path: Option<String>,
    /// Requests in flight each discovered worker may hold, overriding `[admission]
    /// max_in_flight_per_worker`; 0 = no cap. Unset: the fleet default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    /// The models every worker this source finds serves (as in a request body's `model`); empty:
    /// none declared (then no worker of the fleet may declare one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// `empty_after_ms`: how long an empty answer (NXDOMAIN or no records) must persist before
    /// this source's workers are removed. A resolver *failure* never removes them.
    #[serde(
        rename = "empty_after_ms",
        with = "super::millis",
        default = "default_empty_after"
    )]
    pub empty_after: Duration,
    /// `timeout_ms`: how long one resolution may take before it counts as a resolver failure.
    #[serde(
        rename = "timeout_ms",
        with = "super::millis",
        default = "default_timeout"
    )]
    pub timeout: Duration,
}

fn default_scheme() -> String {
    "http".to_owned()
}

fn default_interval() -> Duration {
    DEFAULT_INTERVAL
}

fn default_empty_after() -> Duration {
    DEFAULT_EMPTY_AFTER
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

impl DiscoveryConfig {
    /// An entry for `dns` with every other field at its default.
    pub fn new(dns: &str) -> DiscoveryConfig {
        DiscoveryConfig {
            dns: dns.to_owned(),
            port: None,
            scheme: default_scheme(),
            server_name: None,
            interval: DEFAULT_INTERVAL,
            resolver: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            models: Vec::new(),
            empty_after: DEFAULT_EMPTY_AFTER,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// SRV when the name begins with `_`, else A/AAAA.
    pub fn kind(&self) -> DnsKind {
        if self.dns.starts_with('_') {
            DnsKind::Srv
        } else {
            DnsKind::Address
        }
    }

    /// The source its workers are shown with, `dns:NAME`.
    pub fn source(&self) -> WorkerSource {
        WorkerSource::Dns(self.dns.clone())
    }

    /// The name compared case-insensitively and without a trailing dot, as DNS compares names.
    pub fn canonical_name(&self) -> String {
        self.dns.trim_end_matches('.').to_ascii_lowercase()
    }

    /// Checks the entry; the error names the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        let invalid = |field: &str, message: String| Err(FieldError::new(field, message));
        if let Err(message) = check_dns_name(&self.dns) {
            return invalid("dns", message);
        }
        super::models::check_models(&self.models)?;
        if let Some(Err(error)) = self
            .max_in_flight
            .map(|cap| bch_core::admission::check_cap("max_in_flight", cap))
        {
            return invalid("max_in_flight", error.to_string());
        }
        match (self.kind(), self.port) {
            (DnsKind::Srv, Some(_)) => {
                return invalid(
                    "port",
                    format!(
                        "{:?} is an SRV name (it begins with '_'): its records carry each worker's port; remove port",
                        self.dns
                    ),
                );
            }
            (DnsKind::Address, None) => {
                return invalid(
                    "port",
                    format!(
                        "{:?} is an A/AAAA name: set the workers' port (or use an SRV name, which begins with '_')",
                        self.dns
                    ),
                );
            }
            (DnsKind::Address, Some(0)) => return invalid("port", "must be 1 to 65535".into()),
            _ => {}
        }
        if self.scheme != "http" && self.scheme != "https" {
            return invalid(
                "scheme",
                format!("{:?}: must be \"http\" or \"https\"", self.scheme),
            );
        }
        if self.server_name.is_some() && self.scheme != "https" {
            return invalid(
                "server_name",
                "only https workers have a certificate to check".into(),
            );
        }
        if self.interval < Duration::from_millis(MIN_INTERVAL_MS) {
            return invalid("interval_ms", format!("must be at least {MIN_INTERVAL_MS}"));
        }
        if self.timeout.is_zero() {
            return invalid("timeout_ms", "must be greater than 0".into());
        }
        if self.resolver.is_some_and(|r| r.port() == 0) {
            return invalid("resolver", "the port must be 1 to 65535".into());
        }
        for (field, path) in [
            ("health_path", &self.health_path),
            ("metrics_path", &self.metrics_path),
        ] {
            if path.as_ref().is_some_and(|p| !p.starts_with('/')) {
                return invalid(field, "must start with '/'".into());
            }
        }
        Ok(())
    }
}

/// A DNS name as RFC 1035 and SRV owner names allow it: labels of 1–63 letters, digits, `-` or
/// `_`, 253 characters in all, an optional trailing dot.
fn check_dns_name(name: &str) -> Result<(), String> {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() {
        return Err("must not be empty".into());
    }
    if bare.len() > 253 {
        return Err(format!("{name:?} is longer than 253 characters"));
    }
    for label in bare.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!(
                "{name:?}: every label (between dots) must be 1 to 63 characters"
            ));
        }
        if !label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "{name:?}: labels may hold only letters, digits, '-' and '_'"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_refusals_name_the_field() {
        let srv = DiscoveryConfig::new("_http._tcp.llm.default.svc.cluster.local.");
        assert_eq!(srv.kind(), DnsKind::Srv);
        assert_eq!(srv.validate(), Ok(()));
        assert_eq!(
            srv.source().label(),
            "dns:_http._tcp.llm.default.svc.cluster.local."
        );
        let a = DiscoveryConfig {
            port: Some(8000),
            ..DiscoveryConfig::new("llm.default.svc.cluster.local")
        };
        assert_eq!(a.kind(), DnsKind::Address);
        assert_eq!(a.validate(), Ok(()));
        let cases = [
            (DiscoveryConfig::new(""), "dns"),
            (DiscoveryConfig::new("a..b"), "dns"),
            (DiscoveryConfig::new("a b.c"), "dns"),
            (DiscoveryConfig::new(&"a".repeat(64)), "dns"),
            (DiscoveryConfig::new("llm.test"), "port"),
            (
                DiscoveryConfig {
                    port: Some(8000),
                    ..srv.clone()
                },
                "port",
            ),
            (
                DiscoveryConfig {
                    port: Some(0),
                    ..a.clone()
                },
                "port",
            ),
            (
                DiscoveryConfig {
                    scheme: "ftp".into(),
                    ..srv.clone()
                },
                "scheme",
            ),
            (
                DiscoveryConfig {
                    server_name: Some("llm.example".into()),
                    ..srv.clone()
                },
                "server_name",
            ),
            (
                DiscoveryConfig {
                    interval: Duration::from_millis(10),
                    ..srv.clone()
                },
                "interval_ms",
            ),
            (
                DiscoveryConfig {
                    timeout: Duration::ZERO,
                    ..srv.clone()
                },
                "timeout_ms",
            ),
            (
                DiscoveryConfig {
                    resolver: Some("127.0.0.1:0".parse().unwrap()),
                    ..srv.clone()
                },
                "resolver",
            ),
            (
                DiscoveryConfig {
                    health_path: Some("health".into()),
                    ..srv.clone()
                },
                "health_path",
            ),
            (
                DiscoveryConfig {
                    metrics_path: Some("metrics".into()),
                    ..srv.clone()
                },
                "metrics_path",
            ),
        ];
        for (entry, field) in cases {
            assert_eq!(entry.validate().unwrap_err().field, field, "{entry:?}");
        }
    }
}
