//! The certificates the TLS listeners serve: each listener's rustls `ServerConfig` built from its
//! `[*.tls]` files, swapped whole on a reload ([`ServedCertificates`]). A connection takes the
//! configuration in force when it is accepted, so open connections keep the certificate they
//! were served and new ones get the new one. A reload builds every listener's configuration
//! first and swaps only when all of them built: a bad new file leaves every old one in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;

use super::pem::{self, PemError};
use crate::config::{Config, ListenerTls, TlsListener};

/// Why a listener's TLS configuration could not be built; names the listener's section and the
/// file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A PEM file could not be used.
    #[error("{section}: {error}")]
    Pem {
        /// `server.tls`, `control.tls` or `picker.tls`.
        section: &'static str,
        /// What was wrong with which file.
        error: PemError,
    },
    /// The certificate and the key do not belong together, or rustls refused them.
    #[error("{section}: certificate {cert} and key {key} cannot be served: {reason}")]
    Unusable {
        /// The section.
        section: &'static str,
        /// `cert_file`.
        cert: PathBuf,
        /// `key_file`.
        key: PathBuf,
        /// What rustls said (for a mismatch: the key does not match the certificate).
        reason: String,
    },
    /// The leaf certificate could not be parsed as X.509 (its expiry is unknown).
    #[error("{section}: certificate {cert} is not a valid X.509 certificate: {reason}")]
    Unparsable {
        /// The section.
        section: &'static str,
        /// `cert_file`.
        cert: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// The client CA cannot verify client certificates.
    #[error("{section}: client_ca_file {path} cannot verify client certificates: {reason}")]
    ClientCa {
        /// The section.
        section: &'static str,
        /// `client_ca_file`.
        path: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// A listener that started plain cannot be made TLS by a reload, nor the reverse.
    #[error("{section}: TLS cannot be turned on or off by a reload; restart gatewayd")]
    NeedsRestart {
        /// The section.
        section: &'static str,
    },
}

/// One listener's served configuration, ready to be put in force, and its leaf's notAfter.
pub struct BuiltTls {
    /// The rustls configuration (certificate, client verifier, ALPN, TLS 1.2 and 1.3).
    pub config: Arc<ServerConfig>,
    /// The leaf certificate's notAfter, Unix seconds.
    pub not_after: i64,
    /// The leaf certificate's serial number, hex (for the reload log line).
    pub serial: String,
}

/// The ALPN protocols a listener offers: `h2` on the picker (gRPC), `http/1.1` elsewhere.
fn alpn(listener: TlsListener) -> Vec<Vec<u8>> {
    match listener {
        TlsListener::Picker => vec![b"h2".to_vec()],
        TlsListener::Data | TlsListener::Control => vec![b"http/1.1".to_vec()],
    }
}

/// Builds `listener`'s configuration from `settings` (`section` names them in errors): reads
/// the chain, the key and the client CA, checks that the key matches the certificate and that
/// the leaf parses. An expired certificate still builds (the start-up checks warn or refuse).
pub fn build(
    listener: TlsListener,
    section: &'static str,
    settings: &ListenerTls,
) -> Result<BuiltTls, TlsError> {
    let pem_error = |error| TlsError::Pem { section, error };
    let chain = pem::certificates(&settings.cert_file).map_err(pem_error)?;
    let key = pem::private_key(&settings.key_file).map_err(pem_error)?;
    let (not_after, serial) = leaf_validity(&chain[0]).map_err(|reason| TlsError::Unparsable {
        section,
        cert: settings.cert_file.clone(),
        reason,
    })?;
    let builder = ServerConfig::builder_with_provider(super::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|error| unusable(section, settings, error))?;
    let builder = match settings.client_ca() {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(section, path)?),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|error| unusable(section, settings, error))?;
    config.alpn_protocols = alpn(listener);
    Ok(BuiltTls {
        config: Arc::new(config),
        not_after,
        serial,
    })
}

fn unusable(section: &'static str, settings: &ListenerTls, error: rustls::Error) -> TlsError {
    let reason = match error {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "the private key does not match the certificate".to_owned()
        }
        other => other.to_string(),
    };
    TlsError::Unusable {
        section,
        cert: settings.cert_file.clone(),
        key: settings.key_file.clone(),
        reason,
    }
}

/// A verifier that requires a client certificate chaining to the CAs in `path`.
fn client_verifier(
    section: &'static str,
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let roots = pem::trust_store(path).map_err(|error| TlsError::Pem { section, error })?;
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::provider())
        .build()
        .map_err(|error| TlsError::ClientCa {
            section,
            path: path.to_owned(),
            reason: error.to_string(),
        })
}

/// The leaf's notAfter (Unix seconds) and serial (hex).
pub fn leaf_validity(leaf: &CertificateDer<'_>) -> Result<(i64, String), String> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|error| error.to_string())?;
    let not_after = parsed.validity().not_after.timestamp();
    let serial = parsed.raw_serial_as_string();
    Ok((not_after, serial))
}

/// One TLS listener's configuration in force and its certificate's expiry.
pub struct ServedCertificate {
    /// Which listener.
    pub listener: TlsListener,
    config: ArcSwap<ServerConfig>,
    not_after: AtomicI64,
}

impl ServedCertificate {
    /// The configuration a connection accepted now is served with.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }

    /// The served leaf's notAfter, Unix seconds.
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::Relaxed)
    }

    fn put(&self, built: BuiltTls) {
        self.config.store(built.config);
        self.not_after.store(built.not_after, Ordering::Relaxed);
    }
}

/// Every TLS listener's served certificate: what the accept loops read and what a reload
/// (SIGHUP, `POST /admin/reload`) rebuilds.
#[derive(Default)]
pub struct ServedCertificates {
    listeners: Vec<Arc<ServedCertificate>>,
    /// Every bound listener, TLS or plain: a reload may not change which speak TLS.
    bound: Vec<TlsListener>,
}

impl ServedCertificates {
    /// Builds the served certificate of every TLS listener of `config` among `listeners` (those
    /// that are bound); the first error refuses the start.
    pub fn from_config(config: &Config, listeners: &[TlsListener]) -> Result<Self, TlsError> {
        let mut served = Vec::new();
        for &listener in listeners {
            if let Some((settings, inherited)) = config.listener_tls(listener) {
                let built = build(listener, listener.section(inherited), settings)?;
                served.push(Arc::new(ServedCertificate {
                    listener,
                    not_after: AtomicI64::new(built.not_after),
                    config: ArcSwap::new(built.config),
                }));
            }
        }
        Ok(Self {
            listeners: served,
            bound: listeners.to_vec(),
        })
    }

    /// `listener`'s served certificate, when it speaks TLS.
    pub fn of(&self, listener: TlsListener) -> Option<Arc<ServedCertificate>> {
        self.listeners
            .iter()
            .find(|served| served.listener == listener)
            .cloned()
    }

    /// Every TLS listener's served certificate.
    pub fn all(&self) -> &[Arc<ServedCertificate>] {
        &self.listeners
    }

    /// Re-reads every TLS listener's files as `config` names them; nothing is put in force yet
    /// (see [`Reloaded::put_in_force`]). Errors: a file that cannot be served, or a bound
    /// listener whose TLS the new configuration turns on or off.
    pub fn reload(&self, config: &Config) -> Result<Reloaded, TlsError> {
        let mut built = Vec::new();
        for &listener in &self.bound {
            match (config.listener_tls(listener), self.of(listener)) {
                (Some((settings, inherited)), Some(served)) => {
                    let section = listener.section(inherited);
                    built.push((served, build(listener, section, settings)?));
                }
                (None, None) => {}
                (tls, _) => {
                    // Turned off: the listener's own section names it.
                    let inherited = tls.is_some_and(|(_, inherited)| inherited);
                    return Err(TlsError::NeedsRestart {
                        section: listener.section(inherited),
                    });
                }
            }
        }
        Ok(Reloaded { built })
    }
}

/// Certificates re-read by a reload and not yet in force.
pub struct Reloaded {
    built: Vec<(Arc<ServedCertificate>, BuiltTls)>,
}

impl Reloaded {
    /// Puts every re-read certificate in force: connections accepted from now on are served with
    /// it. Logs each listener's new serial and expiry.
    pub fn put_in_force(self) {
        for (served, built) in self.built {
            tracing::info!(
                listener = served.listener.name(),
                serial = %built.serial,
                not_after = built.not_after,
                "TLS certificate in force"
            );
            served.put(built);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &tempfile::TempDir) -> ListenerTls {
        let made =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_file, made.cert.pem()).expect("write");
        std::fs::write(&key_file, made.signing_key.serialize_pem()).expect("write");
        ListenerTls {
            cert_file,
            key_file,
            client_ca_file: PathBuf::new(),
        }
    }

    #[test]
    fn each_listener_gets_its_alpn_and_a_reload_cannot_turn_tls_on_or_off() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::default();
        config.picker.listen = Some("127.0.0.1:0".parse().expect("address"));
        config.picker.tls = Some(files(&dir));
        let bound = [TlsListener::Data, TlsListener::Control, TlsListener::Picker];
        let served = ServedCertificates::from_config(&config, &bound).expect("builds");
        assert!(served.of(TlsListener::Data).is_none());
        let picker = served.of(TlsListener::Picker).expect("picker speaks TLS");
        assert_eq!(picker.config().alpn_protocols, [b"h2".to_vec()]);
        served.reload(&config).expect("same files").put_in_force();

        let mut on = config.clone();
        on.server.tls = Some(files(&dir));
        let error = served.reload(&on).err().expect("the data plane was plain");
        assert!(
            matches!(
                error,
                TlsError::NeedsRestart {
                    section: "server.tls"
                }
            ),
            "{error}"
        );
        let mut off = config;
        off.picker.tls = None;
        let error = served.reload(&off).err().expect("the picker spoke TLS");
        assert!(
            matches!(
                error,
                TlsError::NeedsRestart {
                    section: "picker.tls"
                }
            ),
            "{error}"
        );
    }
}
