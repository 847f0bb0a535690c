//! The listeners' TLS at start-up: which listeners speak it, their served certificates (built
//! once here, rebuilt by every reload), the handshake failure counts, and the start-up checks
//! `gatewayd check-config` shares: files that cannot be served are errors; a certificate expired
//! or expiring within 14 days, and a picker beyond loopback without mutual TLS, are warnings.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::registry::Registry;

use crate::config::{Config, TlsListener};
use crate::log_limit::LineBudget;
use crate::tls::accept::{HandshakeFailures, TlsAcceptance};
use crate::tls::certificates::{ServedCertificates, TlsError, build};

/// A certificate closer than this to its notAfter is warned about (the deploy/ alert fires at
/// the same point).
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// The listeners `config` binds.
pub(super) fn bound_listeners(config: &Config) -> Vec<TlsListener> {
    let data = config
        .server
        .listeners
        .data_plane
        .then_some(TlsListener::Data);
    let picker = config.picker.listen.map(|_| TlsListener::Picker);
    data.into_iter()
        .chain([TlsListener::Control])
        .chain(picker)
        .collect()
}

/// The TLS errors and warnings of `config`'s bound listeners (see the module documentation).
pub(super) fn tls_findings(config: &Config) -> (Vec<String>, Vec<String>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
        });
    let mut checked = Vec::new();
    for listener in bound_listeners(config) {
        let Some((settings, inherited)) = config.listener_tls(listener) else {
            continue;
        };
        let section = listener.section(inherited);
        // `[server.tls]` serves up to three listeners: one finding each, not three.
        if checked.contains(&section) {
            continue;
        }
        checked.push(section);
        match build(listener, section, settings) {
            Err(error) => errors.push(error.to_string()),
            Ok(built) if built.not_after <= now => warnings.push(format!(
                "{section}: certificate {} expired {} ago: clients will refuse it",
                settings.cert_file.display(),
                humantime::format_duration(Duration::from_secs((now - built.not_after) as u64)),
            )),
            Ok(built) if built.not_after - now < EXPIRY_WARNING.as_secs() as i64 => {
                warnings.push(format!(
                    "{section}: certificate {} expires in {}",
                    settings.cert_file.display(),
                    humantime::format_duration(Duration::from_secs((built.not_after - now) as u64)),
                ))
            }
            Ok(_) => {}
        }
    }
    if let Some(address) = config.picker.listen
        && !address.ip().is_loopback()
        && config
            .listener_tls(TlsListener::Picker)
            .and_then(|(settings, _)| settings.client_ca())
            .is_none()
    {
        warnings.push(format!(
            "picker.listen {address} is beyond loopback without mutual TLS: anyone who reaches it can steer routing; set [picker.tls] client_ca_file (docs/tls.md)"
        ));
    }
    (errors, warnings)
}

/// The listeners' TLS in force: served certificates, handshake failures, the handshake timeout.
#[derive(Clone)]
pub(super) struct ListenerTlsParts {
    pub(super) served: Arc<ServedCertificates>,
    failures: Arc<HandshakeFailures>,
    timeout: Duration,
}

impl ListenerTlsParts {
    /// Builds every bound TLS listener's certificate (already checked by [`tls_findings`]).
    pub(super) fn new(config: &Config) -> Result<Self, TlsError> {
        let served = ServedCertificates::from_config(config, &bound_listeners(config))?;
        Ok(Self {
            served: Arc::new(served),
            failures: Arc::new(HandshakeFailures::new(LineBudget::of(&config.log))),
            timeout: config.server.timeouts.tls_handshake,
        })
    }

    /// What `listener` needs to accept TLS connections; `None` when it is plain.
    pub(super) fn acceptance(&self, listener: TlsListener) -> Option<TlsAcceptance> {
        self.served.of(listener).map(|served| TlsAcceptance {
            served,
            timeout: self.timeout,
            failures: Arc::clone(&self.failures),
        })
    }

    /// Registers the TLS metrics.
    pub(super) fn register(&self, registry: &mut Registry) {
        crate::tls::accept::register(
            registry,
            Arc::clone(&self.served),
            Arc::clone(&self.failures),
        );
    }
}
