//! `gatewayd reload`: asks a running gateway to re-read its configuration file over the control
//! plane (`POST /admin/reload`) and exits with the outcome, so systemd's `ExecReload` (and a
//! script) learns that a reload failed instead of a signal that always "succeeds".

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::app::terminal::{print_err, print_out};
use crate::config::token_file::{TokenFileError, read_token_file};
use bch_tls::ClientTls;

/// Where the gateway's control plane is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct ReloadArgs {
    /// The gateway's configuration file: its server.control_listen and server.admin_token_file
    /// say where to send the reload and with which token.
    #[arg(long, short = 'c', env = "GATEWAYD_CONFIG")]
    pub config: Option<PathBuf>,
    /// The control plane's base URL (e.g. http://127.0.0.1:9090, or https://… for a control plane
    /// with TLS), instead of the file's control_listen (reached over https when the file gives the
    /// control plane a certificate).
    #[arg(long, value_name = "URL")]
    pub control: Option<String>,
    /// PEM file of the CA that signs the control plane's certificate, for an https control
    /// plane; without it the system's trust roots are used. The certificate is always verified.
    #[arg(long, env = "GATEWAYD_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to a control plane that requires client certificates
    /// (mutual TLS); needs --client-key.
    #[arg(long, value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// File holding the control plane's admin token, instead of the file's admin_token_file.
    #[arg(long, env = "GATEWAYD_ADMIN_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// How long to wait for the gateway's answer, in seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout_secs: u64,
}

/// What a configuration file says about reaching its control plane.
#[derive(Debug, Default, PartialEq)]
struct FromFile {
    /// `server.control_listen`.
    listen: Option<SocketAddr>,
    /// `server.admin_token_file`.
    token_file: Option<PathBuf>,
    /// The control plane has a certificate: `[control.tls]`, or `[server.tls]` which it
    /// inherits, names a `cert_file`.
    tls: bool,
}

/// The control address, token file and TLS a configuration file names, read leniently: the file
/// may be the very one that fails to reload, and the gateway's answer says why better than a
/// local parse would.
fn from_file(path: &PathBuf) -> FromFile {
    let Ok(text) = std::fs::read_to_string(path) else {
        return FromFile::default();
    };
    let Ok(value) = text.parse::<toml::Table>() else {
        return FromFile::default();
    };
    let field = |section: &str, name: &str| {
        value
            .get(section)
            .and_then(|s| s.get(name))
            .and_then(toml::Value::as_str)
    };
    let has_certificate = |section: &str| {
        value
            .get(section)
            .and_then(|s| s.get("tls"))
            .and_then(|tls| tls.get("cert_file"))
            .and_then(toml::Value::as_str)
            .is_some_and(|file| !file.is_empty())
    };
    FromFile {
        listen: field("server", "control_listen").and_then(|a| a.parse().ok()),
        token_file: field("server", "admin_token_file").map(PathBuf::from),
        tls: has_certificate("control") || has_certificate("server"),
    }
}

/// The base URL to reach `addr` from this host (https when `tls`): a wildcard listen address is
/// reached on loopback.
fn base_url(addr: SocketAddr, tls: bool) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// Runs `gatewayd reload`: 0 when the gateway reloaded, 1 (with the gateway's reason) when not.
pub fn reload(args: ReloadArgs) -> ExitCode {
    let file = args.config.as_ref().map(from_file).unwrap_or_default();
    let control = args.control.clone().unwrap_or_else(|| {
        base_url(
            file.listen
                .unwrap_or_else(|| crate::config::Listeners::default().control_listen),
            file.tls,
        )
    });
    let client = match ClientTls::from_files(
        args.ca_file.as_deref(),
        args.client_cert.as_deref(),
        args.client_key.as_deref(),
    ) {
        Ok(tls) => tls
            .http_client()
            .timeout(Duration::from_secs(args.timeout_secs)),
        Err(e) => return fail(&e.to_string()),
    };
    let token = match args.token_file.clone().or(file.token_file) {
        Some(path) => match read_token_file(&path) {
            Ok(token) => Some(token),
            Err(TokenFileError::Empty) => {
                return fail(&format!("token file {} is empty", path.display()));
            }
            Err(TokenFileError::Unreadable(e)) => {
                return fail(&format!("cannot read token file {}: {e}", path.display()));
            }
        },
        None => None,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let url = format!("{}/admin/reload", control.trim_end_matches('/'));
    let outcome = runtime.block_on(async {
        let client = client.build()?;
        let mut request = client.post(&url);
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let status = response.status();
        let body = response.text().await?;
        Ok::<_, reqwest::Error>((status, body))
    });
    match outcome {
        Ok((status, body)) if status.is_success() => {
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let workers = answer["workers"].as_array().map_or(0, Vec::len);
            // The reload happened: a stdout that cannot take the summary does not make it fail
            // (systemd's ExecReload would report a reload that took effect as failed).
            let _ = print_out(format_args!(
                "reloaded: policy {}, {workers} workers\n",
                answer["policy"]["kind"].as_str().unwrap_or("?")
            ));
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let message = answer["error"]["message"].as_str().unwrap_or(body.trim());
            fail(&format!("reload failed ({status}): {message}"))
        }
        Err(e) => {
            // A TLS failure leads with what it was: the chain buries it.
            let tls = bch_tls::tls_failure(&e).map(|tls| format!("{tls}: "));
            fail(&format!(
                "cannot reach the control plane at {url}: {}{}",
                tls.unwrap_or_default(),
                crate::error::display_chain(&e)
            ))
        }
    }
}

fn fail(message: &str) -> ExitCode {
    print_err(format_args!("error: {message}"));
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_are_reached_on_loopback() {
        assert_eq!(
            base_url("0.0.0.0:9090".parse().unwrap(), false),
            "http://127.0.0.1:9090"
        );
        assert_eq!(
            base_url("[::]:9090".parse().unwrap(), false),
            "http://[::1]:9090"
        );
        assert_eq!(
            base_url("10.0.0.2:9090".parse().unwrap(), true),
            "https://10.0.0.2:9090"
        );
    }

    #[test]
    fn a_control_plane_with_a_certificate_is_reached_over_https() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gatewayd.toml");
        let read = |text: &str| {
            std::fs::write(&path, text).unwrap();
            from_file(&path)
        };
        let plain = read("[server]\ncontrol_listen = \"127.0.0.1:9191\"\n");
        assert_eq!(plain.listen, Some("127.0.0.1:9191".parse().unwrap()));
        assert!(!plain.tls);
        assert!(read("[server.tls]\ncert_file = \"/etc/bch/tls.crt\"\n").tls);
        assert!(read("[control.tls]\ncert_file = \"/etc/bch/control.crt\"\n").tls);
        assert!(!read("[control.tls]\ncert_file = \"\"\n").tls);
    }
}
