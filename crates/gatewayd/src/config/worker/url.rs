//! A worker's URL, checked and split once into what the proxy, the prober and the picker need:
//! scheme, authority, path prefix and the canonical backend it reaches. Kept apart from the rest
//! of a worker's entry because it is the one part parsed by rules of its own (RFC 3986's, and the
//! ports and credentials that `http`'s parser lets through).
//!
//! A URL with credentials (`user:password@`) is refused without echoing them: the URL as written
//! is the worker's identity, shown by the admin API, telemetry and logs, and sent nowhere safe.

use std::net::SocketAddr;

use http::uri::{Authority, PathAndQuery, Scheme, Uri};

use crate::config::alias::Backend;

/// Why a worker URL was refused; the message quotes the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerUrlError {
    /// Not a URI at all.
    #[error("{url:?} is not a URL: {reason}")]
    NotAUrl {
        /// The URL as written.
        url: String,
        /// The parser's explanation.
        reason: String,
    },
    /// No `http://` or `https://`.
    #[error("{0:?} has no scheme; write http://host:port or https://host:port")]
    NoScheme(String),
    /// A scheme other than `http` and `https`.
    #[error("{0:?}: only http:// and https:// workers are supported")]
    UnsupportedScheme(String),
    /// No host.
    #[error("{0:?} has no host")]
    NoHost(String),
    /// A query string, which would be glued to every request path.
    #[error("{0:?} must not have a query")]
    Query(String),
    /// A fragment (`#…`): never sent, so two URLs differing only by it would name one backend.
    #[error("{0:?} must not have a fragment")]
    Fragment(String),
    /// `user:password@` in the authority. The URL is quoted with the credentials replaced by `***`.
    #[error(
        "{0:?}: credentials in a worker URL are not supported (the URL is shown by the admin API, telemetry and logs); remove the user:password@ part"
    )]
    Credentials(String),
    /// A port outside 1..=65535 (or an empty one).
    #[error("{url:?}: port {port:?} is not a TCP port (1..=65535)")]
    BadPort {
        /// The URL as written.
        url: String,
        /// The port as written.
        port: String,
    },
}

/// A worker's URL split into the parts the proxy needs, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerUrl {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// `host:port`.
    pub authority: Authority,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
    /// The backend the URL reaches, spelled canonically: what alias and loop checks compare.
    pub backend: Backend,
}

impl WorkerUrl {
    /// Parses and checks a worker URL: `http` or `https` scheme, a host, a port in 1..=65535 when one is
    /// written, no credentials, query or fragment.
    pub fn parse(url: &str) -> Result<WorkerUrl, WorkerUrlError> {
        if let Some(redacted) = without_credentials(url) {
            return Err(WorkerUrlError::Credentials(redacted));
        }
        if url.contains('#') {
            return Err(WorkerUrlError::Fragment(url.to_owned()));
        }
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| WorkerUrlError::NotAUrl {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| WorkerUrlError::NoScheme(url.to_owned()))?;
        if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
            return Err(WorkerUrlError::UnsupportedScheme(url.to_owned()));
        }
        let authority = uri
            .authority()
            .cloned()
            .filter(|a| !a.host().is_empty())
            .ok_or_else(|| WorkerUrlError::NoHost(url.to_owned()))?;
        if uri.query().is_some() {
            return Err(WorkerUrlError::Query(url.to_owned()));
        }
        let port = explicit_port(&authority)
            .map(|port| {
                port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                    WorkerUrlError::BadPort {
                        url: url.to_owned(),
                        port: port.to_owned(),
                    }
                })
            })
            .transpose()?;
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
        Ok(WorkerUrl {
            backend: Backend::new(authority.host(), port.unwrap_or(default_port), &prefix),
            scheme,
            authority,
            prefix,
        })
    }

    /// The absolute URI for a request path and query on this worker (`None` means `/`). Fails only
    /// when the prefix and the path together are not a valid URI.
    pub fn join(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let pq = path_and_query.map(PathAndQuery::as_str).unwrap_or("/");
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        if self.prefix.is_empty() {
            builder.path_and_query(pq).build()
        } else {
            builder
                .path_and_query(format!("{}{}", self.prefix, pq))
                .build()
        }
    }

    /// The worker's address for Envoy's endpoint picker: the URL must be `http://IP:PORT` or `https://IP:PORT`, an IP
    /// literal with an explicit port and no path prefix, because Envoy matches a picked endpoint
    /// against its cluster's hosts by address and forwards the client's path unchanged. The error
    /// says what is missing.
    pub fn picker_endpoint(&self) -> Result<SocketAddr, String> {
        let authority = self.authority.as_str();
        let address = authority.parse::<SocketAddr>().map_err(|_| {
            if self.authority.port().is_none() {
                format!("the endpoint picker needs IP:PORT workers (http:// or https://); {authority:?} has no port")
            } else {
                format!(
                    "the endpoint picker needs IP:PORT workers (http:// or https://) (Envoy matches endpoints by address); {:?} is not an IP address",
                    self.authority.host()
                )
            }
        })?;
        if !self.prefix.is_empty() {
            return Err(format!(
                "the endpoint picker needs IP:PORT workers (http:// or https://); the path prefix {:?} cannot be applied by Envoy",
                self.prefix
            ));
        }
        Ok(address)
    }

    /// Default worker name: `host:port`.
    pub fn default_name(&self) -> String {
        self.authority.as_str().to_owned()
    }

    /// Whether the worker is reached over TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// The host and port a connection is opened to: the port as written, else the scheme's (80,
    /// 443); an IPv6 host without its brackets, as the resolver takes it.
    pub fn host_and_port(&self) -> (&str, u16) {
        let default_port = if self.is_https() { 443 } else { 80 };
        (
            self.authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']'),
            self.authority.port_u16().unwrap_or(default_port),
        )
    }
}

/// The port as written after the host (`None` without a `:`). http's own `Authority::port` hides a
/// port that is not a `u16` (`:99999`) as if there were none.
fn explicit_port(authority: &Authority) -> Option<&str> {
    let text = authority.as_str();
    // An IPv6 host is bracketed and full of colons: the port follows the closing bracket.
    let after_host = text.rfind(']').map_or(text, |end| &text[end + 1..]);
    after_host.rfind(':').map(|colon| &after_host[colon + 1..])
}

/// `url` with its userinfo replaced by `***`, when it has one (an `@` between the scheme's `//` and
/// the path); `None` when it has none. The check runs before any other so that no error message
/// quotes a password.
fn without_credentials(url: &str) -> Option<String> {
    let start = url.find("//").map_or(0, |i| i + 2);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let at = url[start..end].rfind('@')? + start;
    Some(format!("{}***{}", &url[..start], &url[at..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picker_endpoints_are_ip_and_port_only() {
        let endpoint = |url: &str| WorkerUrl::parse(url).unwrap().picker_endpoint();
        assert_eq!(
            endpoint("http://127.0.0.1:8101").unwrap().to_string(),
            "127.0.0.1:8101"
        );
        assert_eq!(
            endpoint("http://[::1]:8101/").unwrap().to_string(),
            "[::1]:8101"
        );
        assert!(
            endpoint("http://gpu-0:8000")
                .unwrap_err()
                .contains("\"gpu-0\" is not an IP")
        );
        assert!(endpoint("http://10.0.0.7").unwrap_err().contains("no port"));
        assert!(
            endpoint("http://10.0.0.7:80/v1")
                .unwrap_err()
                .contains("prefix")
        );
    }

    #[test]
    fn ports_are_checked_even_where_http_ignores_them() {
        for (url, port) in [
            ("http://a:1", Some(1)),
            ("http://a:65535", Some(65535)),
            ("http://[::1]:8000", Some(8000)),
            ("http://[::1]", None),
            ("http://a", None),
        ] {
            let parsed = WorkerUrl::parse(url).unwrap();
            assert_eq!(
                explicit_port(&parsed.authority).map(|p| p.parse::<u16>().unwrap()),
                port
            );
        }
    }
}
