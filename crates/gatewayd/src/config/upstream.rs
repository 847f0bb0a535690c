//! `[upstream]`: how gatewayd reaches its workers. Today one subsection, `[upstream.tls]`: the trust
//! for `https://` workers and the client certificate presented to those that require one (mutual
//! TLS). The files are read when the client configuration is built (`upstream::tls`), at start,
//! by `check-config` and on every reload; here only the keys' shape is checked.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::field_error::FieldError;

/// `[upstream]`: the way to workers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// `[upstream.tls]`: TLS toward `https://` workers.
    pub tls: UpstreamTlsConfig,
}

/// `[upstream.tls]`: TLS toward `https://` workers, shared by the data plane, the health prober
/// and the load scraper. Every path is a PEM file; an empty path is unset. Plain `http://` workers
/// never use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// CA certificates a worker's certificate must chain to; empty: the system's trust roots.
    pub ca_file: PathBuf,
    /// Certificate chain presented to workers that ask for one (mutual TLS); set together with
    /// `client_key_file`.
    pub client_cert_file: PathBuf,
    /// The private key of `client_cert_file`.
    pub client_key_file: PathBuf,
}

impl UpstreamTlsConfig {
    /// The CA file, when one is set.
    pub fn ca_file(&self) -> Option<&Path> {
        set(&self.ca_file)
    }

    /// The client certificate and key files, when both are set.
    pub fn client_identity(&self) -> Option<(&Path, &Path)> {
        Some((set(&self.client_cert_file)?, set(&self.client_key_file)?))
    }

    /// The keys' problems (relative to `[upstream]`): a client certificate without its key, or
    /// a key without its certificate.
    pub fn problems(&self) -> Vec<FieldError> {
        match (set(&self.client_cert_file), set(&self.client_key_file)) {
            (Some(_), None) => vec![FieldError::new(
                "tls.client_key_file",
                "must be set with client_cert_file (the key of the client certificate)",
            )],
            (None, Some(_)) => vec![FieldError::new(
                "tls.client_cert_file",
                "must be set with client_key_file (the certificate of the client key)",
            )],
            _ => Vec::new(),
        }
    }
}

fn set(path: &Path) -> Option<&Path> {
    (!path.as_os_str().is_empty()).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_needs_its_key_and_the_key_its_certificate() {
        let parsed: UpstreamConfig =
            toml::from_str("[tls]\nca_file = \"\"\nclient_cert_file = \"c.pem\"\n").unwrap();
        assert_eq!(parsed.tls.ca_file(), None);
        assert_eq!(parsed.tls.problems()[0].field, "tls.client_key_file");
        let key_only = UpstreamTlsConfig {
            client_key_file: "k.pem".into(),
            ..UpstreamTlsConfig::default()
        };
        assert_eq!(key_only.problems()[0].field, "tls.client_cert_file");
        let both = UpstreamTlsConfig {
            client_key_file: "k.pem".into(),
            ..parsed.tls
        };
        assert!(both.problems().is_empty());
        assert_eq!(
            both.client_identity(),
            Some((Path::new("c.pem"), Path::new("k.pem")))
        );
    }
}
