//! The start-up checks that need no socket, shared by [`start`](super::start) and
//! `gatewayd check-config`, so a configuration the check calls fine is one that starts (short of
//! a port being taken): the effective configuration validates (every problem, not the first), the
//! token files read and are not empty, a control plane beyond loopback has a token, and the two
//! listeners can both be bound.

use std::path::Path;

use super::listener_tls::{ListenerTlsParts, tls_findings};
use super::options::{StartError, StartOptions};
use crate::admin::ConfigOrigin;
use crate::config::token_file::{TokenFileError, read_token_file};
use crate::config::{Config, Member};

/// A configuration checked for everything that needs no socket: in force, with its members and
/// token.
pub(super) struct Prepared {
    pub(super) config: Config,
    pub(super) origin: ConfigOrigin,
    pub(super) members: Vec<Member>,
    pub(super) token: Option<String>,
    pub(super) metrics_token: Option<String>,
    /// TLS toward `https://` workers, its files read.
    pub(super) worker_tls: rustls::ClientConfig,
    pub(super) handle_signals: bool,
    pub(super) tls: ListenerTlsParts,
}

/// What [`check`] found: problems that refuse a start, and warnings that do not.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Findings {
    /// One sentence per problem, naming the field (and file) at fault.
    pub errors: Vec<String>,
    /// Things that start but are probably not meant (no workers and no discovery source).
    pub warnings: Vec<String>,
    /// The configuration that would be in force, when it has no problem.
    pub config: Option<Config>,
    /// The warnings (also in `warnings`) worth a line at every start, not only in check-config:
    /// a TLS certificate expired or about to, a picker open beyond loopback.
    pub start_up_warnings: Vec<String>,
}

/// Runs every start-up check that needs no socket on `options` and reports all it found.
pub fn check(options: &StartOptions) -> Findings {
    check_with_members(options).0
}

/// [`check`], and the worker list's members that passed, which start-up goes on with.
fn check_with_members(options: &StartOptions) -> (Findings, Vec<Member>) {
    let base = options.effective_unvalidated();
    let path = options.origin.path.as_deref();
    let (problems, members) = base.problems_and_members(path);
    let mut errors: Vec<String> = problems.iter().map(ToString::to_string).collect();
    if let Err(error) = admin_token(&base) {
        errors.push(error.to_string());
    }
    if let Some(Err(error)) = base
        .server
        .control_access
        .metrics_token_file
        .as_deref()
        .map(|path| read_token(METRICS_TOKEN_KEY, path))
    {
        errors.push(error.to_string());
    }
    if let Err(error) = crate::upstream::tls::client_config(&base.upstream.tls) {
        errors.push(error.field_error().to_string());
    }
    let token_configured = base.server.control_access.admin_token_file.is_some();
    if !token_configured && !base.server.listeners.control_listen.ip().is_loopback() {
        errors.push(
            StartError::UnprotectedControlPlane(base.server.listeners.control_listen).to_string(),
        );
    }
    let (tls_errors, mut start_up_warnings) = tls_findings(&base);
    errors.extend(tls_errors);
    start_up_warnings.extend(crate::upstream::tls::expired_client_certificate(
        &base.upstream.tls,
    ));
    let mut warnings = start_up_warnings.clone();
    if base.workers.is_empty() && base.discovery.is_empty() {
        warnings.push(
            "no workers configured: every request gets 503 until one is added (POST /admin/workers, --worker URL or --discover-dns NAME)"
                .to_owned(),
        );
    }
    let config = errors.is_empty().then_some(base);
    let findings = Findings {
        errors,
        warnings,
        config,
        start_up_warnings,
    };
    (findings, members)
}

/// Every start-up check that needs no socket (see [`check`]); all problems at once in
/// [`StartError::Invalid`].
pub(super) fn prepare(options: StartOptions) -> Result<Prepared, StartError> {
    let (findings, members) = check_with_members(&options);
    let Some(config) = findings.config else {
        return Err(StartError::Invalid(findings.errors));
    };
    // The TLS warnings (an expiring certificate, a picker open beyond loopback) are worth a
    // line at every start, not only when someone runs check-config.
    for warning in &findings.start_up_warnings {
        tracing::warn!("{warning}");
    }
    let tls = ListenerTlsParts::new(&config).map_err(|e| StartError::Tls(e.to_string()))?;
    let token = admin_token(&config)?;
    let metrics_token = config
        .server
        .control_access
        .metrics_token_file
        .as_deref()
        .map(|path| read_token(METRICS_TOKEN_KEY, path))
        .transpose()?;
    let worker_tls = crate::upstream::tls::client_config(&config.upstream.tls)
        .map_err(|error| StartError::Invalid(vec![error.field_error().to_string()]))?;
    Ok(Prepared {
        config,
        origin: options.origin,
        members,
        token,
        metrics_token,
        worker_tls,
        handle_signals: options.handle_signals,
        tls,
    })
}

/// The bearer token from `admin_token_file`, trimmed; `None` when no file is configured.
fn admin_token(config: &Config) -> Result<Option<String>, StartError> {
    config
        .server
        .control_access
        .admin_token_file
        .as_deref()
        .map(|path| read_token(ADMIN_TOKEN_KEY, path))
        .transpose()
}

/// The key of the control plane's token file, as the error messages name it.
const ADMIN_TOKEN_KEY: &str = "admin_token_file";
/// The key of the `/metrics` token file, as the error messages name it.
const METRICS_TOKEN_KEY: &str = "metrics_token_file";

/// A token file's contents, trimmed; an unreadable or empty file is an error naming it and `key`,
/// the setting that named it.
pub(super) fn read_token(key: &'static str, path: &Path) -> Result<String, StartError> {
    read_token_file(path).map_err(|error| match error {
        TokenFileError::Unreadable(cause) => StartError::TokenFile {
            key,
            path: path.to_owned(),
            cause,
        },
        TokenFileError::Empty => StartError::EmptyToken {
            key,
            path: path.to_owned(),
        },
    })
}
