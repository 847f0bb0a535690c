//! The TLS flags of every command that talks to a gateway (`storm`, `ab`, `sweep`): whom to
//! trust on https gateways and control planes, and the client certificate for those that
//! require one. They become one [`ClientTls`], built once per invocation.

use std::path::PathBuf;

use bch_drill::tls::ClientTls;
use clap::Args;

/// `--ca-file`, `--client-cert`, `--client-key`.
#[derive(Debug, Args)]
pub(crate) struct TlsFlags {
    /// PEM file of the CA certificates that sign https gateways' and control planes'
    /// certificates. Without it the system's trust roots are used. Certificates are always
    /// verified.
    #[arg(long, env = "BCH_CA_FILE", value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to control planes and gateways that require client
    /// certificates (mutual TLS); needs --client-key.
    #[arg(
        long,
        env = "BCH_CLIENT_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(
        long,
        env = "BCH_CLIENT_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    client_key: Option<PathBuf>,
}

impl TlsFlags {
    /// The trust and identity the flags name.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds nothing usable; the error names it.
    pub(crate) fn client_tls(&self) -> anyhow::Result<ClientTls> {
        Ok(ClientTls::from_files(
            self.ca_file.as_deref(),
            self.client_cert.as_deref(),
            self.client_key.as_deref(),
        )?)
    }
}
