//! The command line: `--url`, `--token-file` and the TLS files, each also taken from the
//! environment, checked before the terminal is touched so that a typo is a plain error message
//! rather than a console stuck reconnecting.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use clap::Parser;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The bch operator console shows gatewayd's workers, ring, routing keys and spills live, and
/// changes the bounded policy's thresholds while it runs.
#[derive(Debug, Clone, Parser)]
#[command(name = "bch-tui", version)]
pub struct Cli {
    /// The URL of gatewayd's telemetry websocket, the control plane's `/ws` endpoint: ws://, or
    /// wss:// for a control plane with TLS. Repeat it (or separate URLs with commas) to watch
    /// several replicas of one fleet, ws:// and wss:// mixed: the console merges their fleets,
    /// shows one row per replica and sends every threshold change to all of them.
    #[arg(
        long,
        env = "BCH_TUI_URL",
        default_value = "ws://127.0.0.1:9090/ws",
        value_delimiter = ','
    )]
    pub url: Vec<String>,

    /// A file holding the control plane's admin token (gatewayd's `admin_token_file`), which is
    /// sent as `Authorization: Bearer <token>` on the websocket upgrade.
    #[arg(long, env = "BCH_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// PEM file of the CA certificates that sign the wss:// control planes' certificates.
    /// Without it the system's trust roots are used. Certificates are always verified.
    #[arg(long, env = "BCH_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,

    /// PEM certificate chain presented to control planes that require client certificates
    /// (mutual TLS); needs --client-key.
    #[arg(
        long,
        env = "BCH_CLIENT_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of --client-cert.
    #[arg(
        long,
        env = "BCH_CLIENT_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,

    /// Record every frame received, from every replica, with its receive time, into FILE (created
    /// or truncated); replay it with --replay. Format: docs/protocol.md, "Recordings".
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    pub record: Option<PathBuf>,

    /// Play a recording (bch-tui --record, or gatewayd's [telemetry] record_file, with the files
    /// it rotated into: FILE.8 … FILE.1, then FILE) in the console instead of connecting: space pauses, ←/→ seek 10 s, [ and ] jump to the previous/next
    /// spill, < and > to the start/end, - and + change the speed (×0.25 to ×16). --url and the
    /// connection's flags are ignored (so BCH_TUI_URL in the environment does not get in the way).
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,

    /// Print one rendered screen as text after SECONDS (of watching, or of recorded time with
    /// --replay) and exit, without taking the terminal: for scripts and CI.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub snapshot: Option<std::time::Duration>,

    /// The --snapshot screen's width, in columns.
    #[arg(long, default_value_t = 120, requires = "snapshot", value_parser = clap::value_parser!(u16).range(20..=1000))]
    pub width: u16,

    /// The --snapshot screen's height, in rows.
    #[arg(long, default_value_t = 40, requires = "snapshot", value_parser = clap::value_parser!(u16).range(10..=1000))]
    pub height: u16,

    /// Watch only: the threshold, capacity and drain keys send nothing and say so. A gateway
    /// connection opened with the metrics token is read-only whatever this says.
    #[arg(long)]
    pub read_only: bool,

    /// Start on MODEL's pool: the panels show the workers that serve MODEL, the ring the gateway
    /// routes it on, their keys and spills, and OVER by the pool's own bound (`m` goes on to
    /// the next model, then back to every worker). Exact, case-sensitive name.
    #[arg(long, value_name = "MODEL", value_parser = model_name)]
    pub model: Option<String>,

    /// Minutes a worker may drain before the warnings pane (`w`) reports it.
    #[arg(long, default_value_t = 5, value_name = "MINUTES")]
    pub drain_warning: u64,
}

/// A `--model` name: any text but a blank one, which no worker can declare.
fn model_name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("a model name, not blank (leave --model out to show every worker)".into());
    }
    Ok(text.to_owned())
}

/// A number of seconds, whole or not (`2`, `0.5`), at most a day.
fn seconds(text: &str) -> Result<std::time::Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&seconds) {
        return Err(format!("{text}: expected 0 to 86400 seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

impl Cli {
    /// Checks the URL before any terminal setup, so a typo is a plain error message rather than a
    /// console stuck reconnecting.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.url.is_empty(), "--url: give at least one gateway");
        for (i, url) in self.url.iter().enumerate() {
            anyhow::ensure!(
                !self.url[..i].contains(url),
                "--url {url}: given twice; each replica once"
            );
            let one = UrlCheck { url };
            one.check_scheme()?;
            one.check_host()?;
            one.check_parsed_port()?;
        }
        Ok(())
    }
}

/// The checks of one `--url`.
struct UrlCheck<'a> {
    url: &'a str,
}

impl UrlCheck<'_> {
    /// The URL after its `ws://` or `wss://`; `None` for any other scheme.
    fn after_scheme(&self) -> Option<&str> {
        self.url
            .strip_prefix("ws://")
            .or_else(|| self.url.strip_prefix("wss://"))
    }

    fn check_scheme(&self) -> anyhow::Result<()> {
        if self.after_scheme().is_none() {
            bail!(
                "--url {}: expected a ws:// or wss:// URL such as ws://127.0.0.1:9090/ws",
                self.url
            );
        }
        Ok(())
    }

    /// Called after `check_scheme`, so the URL starts with `ws://` or `wss://`.
    fn check_host(&self) -> anyhow::Result<()> {
        let authority = self
            .after_scheme()
            .unwrap_or_default()
            .split(['/', '?'])
            .next()
            .unwrap_or_default();
        if authority.is_empty() || authority.starts_with(':') {
            bail!(
                "--url {}: no host; expected ws://HOST:PORT/ws (or wss://) such as \
                 ws://127.0.0.1:9090/ws",
                self.url
            );
        }
        Ok(())
    }

    /// Parses the URL the way the connection will, and checks that the port survived the parse.
    fn check_parsed_port(&self) -> anyhow::Result<()> {
        // The error's own text, not a context chain: tungstenite's error repeats its source.
        let request = self
            .url
            .into_client_request()
            .map_err(|e| anyhow!("--url {}: {e}", self.url))?;
        // `http` drops a port it cannot parse (`:99999`) and tungstenite would then quietly
        // connect to port 80.
        let uri = request.uri();
        let host_port = uri
            .authority()
            .map(|a| a.as_str().rsplit('@').next().unwrap_or_default())
            .unwrap_or_default();
        let written_port = host_port
            .rsplit_once(':')
            .map(|(_, port)| port)
            .filter(|port| !port.is_empty() && !port.ends_with(']'));
        let usable = uri.port_u16().is_some_and(|p| p != 0);
        if let (Some(port), false) = (written_port, usable) {
            bail!(
                "--url {}: port {port} is not a number from 1 to 65535",
                self.url
            );
        }
        Ok(())
    }
}

impl Cli {
    /// The bearer token from `--token-file`, or `None` without one; an unreadable or empty file is
    /// an error naming the flag. Every replica gets the same token.
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        self.token_file.as_deref().map(read_token).transpose()
    }

    /// The TLS configuration every `wss://` replica's connection uses, from `--ca-file`,
    /// `--client-cert` and `--client-key` (read once here, before the terminal is set up, so a
    /// bad file is a plain error message).
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds nothing usable (the error names the file), or only
    /// one of `--client-cert` and `--client-key`.
    pub fn tls(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let tls = bch_tls::ClientTls::from_files(
            self.ca_file.as_deref(),
            self.client_cert.as_deref(),
            self.client_key.as_deref(),
        )?;
        Ok(tls.config())
    }
}

/// bch-tui's one token-file reader: the file read here, its contents parsed by
/// [`bch_core::token::bearer_token`] (surrounding whitespace is not part of the token); errors
/// name the flag and the file.
fn read_token(path: &Path) -> anyhow::Result<String> {
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file {}", path.display()))?;
    bch_core::token::bearer_token(&raw)
        .map_err(|error| anyhow!("--token-file {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_and_validation() {
        let cli = Cli::try_parse_from(["bch-tui"]).unwrap();
        assert_eq!(cli.url, ["ws://127.0.0.1:9090/ws"]);
        assert!(cli.token_file.is_none());
        assert!(!cli.read_only);
        assert!(
            Cli::try_parse_from(["bch-tui", "--read-only"])
                .unwrap()
                .read_only
        );
        cli.validate().unwrap();
        assert_eq!(cli.model, None, "every worker unless a model is asked for");
        let on_one = Cli::try_parse_from(["bch-tui", "--model", "qwen-2.5-7b"]).unwrap();
        assert_eq!(on_one.model.as_deref(), Some("qwen-2.5-7b"));
        for blank in ["", "  "] {
            let err = Cli::try_parse_from(["bch-tui", "--model", blank]).unwrap_err();
            assert!(err.to_string().contains("--model"), "{err}");
            assert!(err.to_string().contains("blank"), "{err}");
        }
        for bad in [
            "http://127.0.0.1:9090/ws",
            "https://gw:9090/ws",
            "ws://",
            "wss://",
            "wss://gw:99999/ws",
            "ws://127.0.0.1:99999/ws",
            "ws://127.0.0.1:0/ws",
            "ws://127.0.0.1:90x/ws",
        ] {
            let cli = Cli::try_parse_from(["bch-tui", "--url", bad]).unwrap();
            let err = cli.validate().unwrap_err();
            assert!(format!("{err:#}").contains("--url"), "{bad}: {err:#}");
        }
        for hostless in ["ws://", "ws:///ws", "ws://:9090/ws", "wss://:9090/ws"] {
            let cli = Cli::try_parse_from(["bch-tui", "--url", hostless]).unwrap();
            let err = format!("{:#}", cli.validate().unwrap_err());
            assert!(err.contains("no host"), "{hostless}: {err}");
        }
        let several = Cli::try_parse_from([
            "bch-tui",
            "--url",
            "ws://a:9090/ws",
            "--url",
            "ws://b:9090/ws,ws://c:9090/ws",
        ])
        .unwrap();
        assert_eq!(several.url.len(), 3);
        several.validate().unwrap();
        let twice =
            Cli::try_parse_from(["bch-tui", "--url", "ws://a/ws", "--url", "ws://a/ws"]).unwrap();
        assert!(twice.validate().unwrap_err().to_string().contains("twice"));
        for good in [
            "ws://127.0.0.1:9090/ws",
            "ws://gw/ws",
            "ws://[::1]:9090/ws",
            "ws://[::1]/ws",
            "ws://user:pw@gw:9090/ws",
            "wss://gw.example:9090/ws",
            "wss://[::1]:9443/ws",
        ] {
            let cli = Cli::try_parse_from(["bch-tui", "--url", good]).unwrap();
            cli.validate().unwrap_or_else(|e| panic!("{good}: {e:#}"));
        }
    }

    #[test]
    fn record_replay_and_snapshot_flags() {
        let cli = Cli::try_parse_from(["bch-tui", "--snapshot", "1.5"]).unwrap();
        assert_eq!(cli.snapshot, Some(std::time::Duration::from_millis(1500)));
        assert_eq!((cli.width, cli.height), (120, 40));
        let cli = Cli::try_parse_from([
            "bch-tui",
            "--replay",
            "d.jsonl",
            "--snapshot",
            "3",
            "--width",
            "80",
            "--height",
            "24",
        ])
        .unwrap();
        assert_eq!((cli.width, cli.height), (80, 24));
        for bad in [
            &["bch-tui", "--snapshot", "-1"][..],
            &["bch-tui", "--snapshot", "soon"],
            &["bch-tui", "--width", "80"],
            &["bch-tui", "--snapshot", "1", "--width", "5"],
            &["bch-tui", "--replay", "a", "--record", "b"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn token_file_is_trimmed_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("bch-tui-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "s3cret\n").unwrap();
        assert_eq!(read_token(&good).unwrap(), "s3cret");
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        assert!(
            read_token(&empty)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        assert!(read_token(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
