//! Which backend a worker URL reaches, spelled one way: for refusing a second worker that is an
//! alias of a registered one, and a worker that is this gateway's own listener.
//!
//! The URL as written stays the worker's ring identity (placement parity with SGLang Model
//! Gateway hashes the string as registered); only these comparisons use the canonical form.
//! `HTTP://Host:80/`, `http://host`, `http://localhost:P`, `http://0x7f.1:P`, `http://2130706433:P`
//! and `http://[::ffff:127.0.0.1]:P` each reach what `http://127.0.0.1:P` reaches: the resolver
//! takes every numeric IPv4 spelling `inet_aton` takes, and `localhost` and `0.0.0.0` are this host.
//! Names are compared as names (case-insensitive, without a trailing dot): two different names
//! of one machine are not detected, because detecting them would take a DNS lookup.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A worker URL's backend: canonical host, port (the scheme's, 80 or 443, when none is written)
/// and path prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Backend {
    host: Host,
    port: u16,
    prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Host {
    Ip(IpAddr),
    Name(String),
}

impl Backend {
    /// The backend of `host` (as in a URI authority: IPv6 in brackets), `port` and `prefix` (no
    /// trailing slash).
    pub fn new(host: &str, port: u16, prefix: &str) -> Self {
        Self {
            host: canonical_host(host),
            port,
            prefix: prefix.to_owned(),
        }
    }

    /// Whether a request sent here arrives at a listener bound to `listener`: same port, and the
    /// same address, or any loopback address of the family when the listener is unspecified
    /// (`0.0.0.0`, `[::]`). A name is never a listener here (that would take a DNS lookup); the
    /// `Via` check catches what this misses.
    pub fn is_listener(&self, listener: SocketAddr) -> bool {
        let Host::Ip(ip) = self.host else {
            return false;
        };
        self.port == listener.port()
            && match listener.ip() {
                any if any.is_unspecified() => {
                    ip.is_loopback() && (ip.is_ipv4() == any.is_ipv4() || any.is_ipv6())
                }
                bound => canonical_ip(bound) == ip,
            }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}{}", self.port, self.prefix),
            Host::Ip(ip) => write!(f, "{ip}:{}{}", self.port, self.prefix),
            Host::Name(name) => write!(f, "{name}:{}{}", self.port, self.prefix),
        }
    }
}

fn canonical_host(host: &str) -> Host {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match inner.parse::<Ipv6Addr>() {
            Ok(ip) => Host::Ip(canonical_ip(IpAddr::V6(ip))),
            Err(_) => Host::Name(host),
        };
    }
    if host == "localhost" {
        return Host::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    match inet_aton(&host) {
        Some(ip) => Host::Ip(canonical_ip(IpAddr::V4(ip))),
        None => Host::Name(host),
    }
}

/// IPv4-mapped IPv6 as IPv4; the unspecified address, which a connect reaches this host by, as
/// loopback.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    }
}

/// IPv4 as the C resolver reads it (`inet_aton`): one to four parts, each decimal, octal (leading
/// `0`) or hex (`0x`); the last part fills the remaining bytes (`127.1`, `0x7f.1`, `2130706433`).
fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut value: u32 = 0;
    for (index, part) in parts.iter().enumerate() {
        let number = parse_c_number(part)?;
        if index + 1 < parts.len() {
            if number > 255 {
                return None;
            }
            value |= number << (8 * (3 - index));
        } else {
            let bits = 8 * (4 - index as u32);
            if bits < 32 && number >= 1 << bits {
                return None;
            }
            value |= number;
        }
    }
    Some(Ipv4Addr::from(value))
}

fn parse_c_number(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(host: &str, port: u16) -> Backend {
        Backend::new(host, port, "")
    }

    #[test]
    fn every_spelling_of_loopback_is_one_backend() {
        let canonical = backend("127.0.0.1", 8000);
        for host in [
            "127.0.0.1",
            "LOCALHOST",
            "localhost.",
            "0x7f.1",
            "0x7F000001",
            "2130706433",
            "127.1",
            "0177.0.0.1",
            "127.0.1",
            "0.0.0.0",
            "[::ffff:127.0.0.1]",
        ] {
            assert_eq!(backend(host, 8000), canonical, "{host}");
        }
        assert_eq!(canonical.to_string(), "127.0.0.1:8000");
    }

    #[test]
    fn different_hosts_ports_and_prefixes_stay_different() {
        let base = backend("127.0.0.1", 8000);
        for other in [
            backend("127.0.0.2", 8000),
            backend("127.0.0.1", 8001),
            backend("[::1]", 8000),
            backend("gpu-1", 8000),
            backend("1e100.example", 8000),
            backend("256.0.0.1", 8000),
            Backend::new("127.0.0.1", 8000, "/v2"),
        ] {
            assert_ne!(other, base, "{other}");
        }
        assert_eq!(backend("GPU-1.", 80), backend("gpu-1", 80));
        assert_eq!(backend("[0::1]", 80), backend("[::1]", 80));
        assert_eq!(inet_aton("1.2.3.256"), None);
        assert_eq!(inet_aton("1.2.65536"), None);
        assert_eq!(inet_aton("1.2.65535"), Some(Ipv4Addr::new(1, 2, 255, 255)));
        assert_eq!(inet_aton("09"), None);
        assert_eq!(inet_aton("0x"), None);
        assert_eq!(inet_aton("4294967296"), None);
    }

    #[test]
    fn listeners_are_recognised_by_address_or_loopback_when_unspecified() {
        let on = |addr: &str| addr.parse::<SocketAddr>().unwrap();
        assert!(backend("localhost", 8080).is_listener(on("127.0.0.1:8080")));
        assert!(!backend("localhost", 8081).is_listener(on("127.0.0.1:8080")));
        assert!(!backend("127.0.0.2", 8080).is_listener(on("127.0.0.1:8080")));
        assert!(backend("127.0.0.2", 8080).is_listener(on("0.0.0.0:8080")));
        assert!(backend("[::1]", 8080).is_listener(on("[::]:8080")));
        assert!(backend("127.0.0.1", 8080).is_listener(on("[::]:8080")));
        assert!(!backend("[::1]", 8080).is_listener(on("0.0.0.0:8080")));
        assert!(!backend("10.0.0.7", 8080).is_listener(on("0.0.0.0:8080")));
        assert!(!backend("gateway", 8080).is_listener(on("0.0.0.0:8080")));
    }
}
