//! A listener's TLS settings (`[server.tls]`, and the per-listener overrides `[control.tls]` and
//! `[picker.tls]`), and `[control]`, the section that holds the control plane's override. Absent
//! means plain HTTP on that listener. docs/tls.md tells the whole story.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::field_error::FieldError;

/// One listener's TLS: the certificate it serves and, when set, the CA its clients' certificates
/// must chain to (mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerTls {
    /// `cert_file`: the certificate chain, PEM, leaf first.
    pub cert_file: PathBuf,
    /// `key_file`: the leaf's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// `client_ca_file`: CA certificates, PEM; set (not empty) = every client must present a
    /// certificate that chains to one of them (mutual TLS).
    pub client_ca_file: PathBuf,
}

impl ListenerTls {
    /// The client CA file when mutual TLS is asked for; `None` when `client_ca_file` is empty.
    pub fn client_ca(&self) -> Option<&Path> {
        (!self.client_ca_file.as_os_str().is_empty()).then_some(self.client_ca_file.as_path())
    }

    /// An empty `cert_file` or `key_file` (TLS on a listener needs both). The files themselves
    /// are read by the start-up checks, which report what is wrong with them.
    pub fn problems(&self) -> Vec<FieldError> {
        [("cert_file", &self.cert_file), ("key_file", &self.key_file)]
            .into_iter()
            .filter(|(_, path)| path.as_os_str().is_empty())
            .map(|(key, _)| FieldError::new(key, "must be set when the listener speaks TLS"))
            .collect()
    }
}

/// `[control]`: settings of the control plane's listener that differ from `[server]`'s.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// `[control.tls]`: the control plane's own TLS; unset = `[server.tls]`'s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
}

/// The listeners that can speak TLS, as metrics and log lines name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsListener {
    /// The data plane (`[server] listen`).
    Data,
    /// The control plane (`[server] control_listen`): admin API, `/metrics`, `/ws`.
    Control,
    /// Envoy's endpoint picker (`[picker] listen`).
    Picker,
}

impl TlsListener {
    /// The listener's name in the `listener` label and in log lines.
    pub fn name(self) -> &'static str {
        match self {
            TlsListener::Data => "data",
            TlsListener::Control => "control",
            TlsListener::Picker => "picker",
        }
    }

    /// The configuration section that sets this listener's own TLS.
    pub fn section(self, inherited: bool) -> &'static str {
        match (self, inherited) {
            (TlsListener::Data, _) | (_, true) => "server.tls",
            (TlsListener::Control, false) => "control.tls",
            (TlsListener::Picker, false) => "picker.tls",
        }
    }
}
