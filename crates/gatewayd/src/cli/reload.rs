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

/// Where the gateway's control plane is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct ReloadArgs {
    /// The gateway's configuration file: its server.control_listen and server.admin_token_file
    /// say where to send the reload and with which token.
    #[arg(long, short = 'c', env = "GATEWAYD_CONFIG")]
    pub config: Option<PathBuf>,
    /// The control plane's base URL (e.g. http://127.0.0.1:9090), instead of the file's
    /// control_listen.
    #[arg(long, value_name = "URL")]
    pub control: Option<String>,
    /// File holding the control plane's admin token, instead of the file's admin_token_file.
    #[arg(long, env = "GATEWAYD_ADMIN_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// How long to wait for the gateway's answer, in seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout_secs: u64,
}

/// The control address and token file a configuration file names, read leniently: the file may
/// be the very one that fails to reload, and the gateway's answer says why better than a local
/// parse would.
fn from_file(path: &PathBuf) -> (Option<SocketAddr>, Option<PathBuf>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (None, None);
    };
    let Ok(value) = text.parse::<toml::Table>() else {
        return (None, None);
    };
    let server = value.get("server").and_then(toml::Value::as_table);
    let field = |name: &str| {
        server
            .and_then(|s| s.get(name))
            .and_then(toml::Value::as_str)
    };
    (
        field("control_listen").and_then(|a| a.parse().ok()),
        field("admin_token_file").map(PathBuf::from),
    )
}

/// The base URL to reach `addr` from this host: a wildcard listen address is reached on loopback.
fn base_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// Runs `gatewayd reload`: 0 when the gateway reloaded, 1 (with the gateway's reason) when not.
pub fn reload(args: ReloadArgs) -> ExitCode {
    let (listen, file_token) = args.config.as_ref().map(from_file).unwrap_or_default();
    let control = args.control.clone().unwrap_or_else(|| {
        base_url(listen.unwrap_or_else(|| crate::config::Listeners::default().control_listen))
    });
    let token = match args.token_file.clone().or(file_token) {
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
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(args.timeout_secs))
            .build()?;
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
        Err(e) => fail(&format!(
            "cannot reach the control plane at {url}: {}",
            crate::error::display_chain(&e)
        )),
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
            base_url("0.0.0.0:9090".parse().unwrap()),
            "http://127.0.0.1:9090"
        );
        assert_eq!(base_url("[::]:9090".parse().unwrap()), "http://[::1]:9090");
        assert_eq!(
            base_url("10.0.0.2:9090".parse().unwrap()),
            "http://10.0.0.2:9090"
        );
    }
}
