//! Command line: run the daemon (default), `check-config FILE`, `explain`.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use bch_core::explain::{Explainer, Scenario};
use bch_core::policy::PolicyKind;
use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat, WorkerConfig};
use crate::gateway::Gateway;

/// bch gateway daemon: bounded consistent hashing in front of LLM inference workers.
#[derive(Debug, Parser)]
#[command(name = "gatewayd", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A subcommand; without one, gatewayd runs the proxy.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of the proxy itself.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file and print the effective configuration; exit 1 on error.
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
    /// Offline what-if: which worker and branch would a key get? Reserves nothing.
    Explain(ExplainArgs),
}

/// Options of the proxy. Flags override the configuration file.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Configuration file (TOML; see config/gatewayd.toml).
    #[arg(long, short = 'c', env = "GATEWAYD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data plane listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "GATEWAYD_LISTEN", value_name = "IP:PORT", value_parser = parse_addr)]
    pub listen: Option<SocketAddr>,
    /// Control plane listen address (metrics, admin API, /ws) [default: 127.0.0.1:9090].
    #[arg(long, env = "GATEWAYD_CONTROL_LISTEN", value_name = "IP:PORT", value_parser = parse_addr)]
    pub control_listen: Option<SocketAddr>,
    /// Worker base URL; repeat for more workers (added after the file's workers).
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// Routing policy.
    #[arg(long, value_parser = parse_policy)]
    pub policy: Option<PolicyKind>,
    /// Bounded policy: in-flight requests the preferred worker may exceed the minimum by.
    #[arg(long)]
    pub min_load_gap: Option<u64>,
    /// Bounded policy: factor over the mean load the preferred worker may reach (finite, >= 1.0).
    #[arg(long)]
    pub max_load_skew: Option<f64>,
    /// File holding the control plane bearer token.
    #[arg(long, env = "GATEWAYD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Health probe path for every worker without its own (e.g. /v1/models for llama.cpp).
    #[arg(long)]
    pub health_path: Option<String>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Run the demo: embedded simulated workers, a gentle background storm, bounded policy.
    #[arg(long)]
    pub demo: bool,
    /// Demo: number of simulated workers.
    #[arg(long, default_value_t = 4, requires = "demo")]
    pub demo_workers: usize,
}

/// `gatewayd explain` options.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Read one JSON scenario per line on stdin and write one `{"worker","branch"}` per line.
    #[arg(long, conflicts_with_all = ["workers", "routing_key"])]
    pub batch: bool,
    /// Worker URL (configuration order); repeat.
    #[arg(long = "worker", value_name = "URL", required_unless_present = "batch")]
    pub workers: Vec<String>,
    /// In-flight load of a worker before the request, `URL=N`; repeat.
    #[arg(long = "load", value_name = "URL=N", value_parser = parse_load)]
    pub loads: Vec<(String, u64)>,
    /// A worker that is unhealthy; repeat.
    #[arg(long = "unhealthy", value_name = "URL")]
    pub unhealthy: Vec<String>,
    /// The routing key.
    #[arg(long, required_unless_present = "batch")]
    pub routing_key: Option<String>,
    /// Treat the key as implicit (Authorization-like): never spills.
    #[arg(long)]
    pub implicit: bool,
    /// Threshold, requests.
    #[arg(long, default_value_t = bch_core::policy::DEFAULT_MIN_LOAD_GAP)]
    pub min_load_gap: u64,
    /// Threshold, factor.
    #[arg(long, default_value_t = bch_core::policy::DEFAULT_MAX_LOAD_SKEW)]
    pub max_load_skew: f64,
    /// Policy.
    #[arg(long, value_parser = parse_policy, default_value = "bounded_consistent_hashing")]
    pub policy: PolicyKind,
}

fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    s.parse()
        .map_err(|e: bch_core::policy::PolicyError| e.to_string())
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("expected IP:PORT such as 127.0.0.1:8080 (host names are not resolved), got {s:?}")
    })
}

fn parse_load(s: &str) -> Result<(String, u64), String> {
    let (url, n) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("expected URL=N, got {s:?}"))?;
    let n = n
        .parse()
        .map_err(|_| format!("load in {s:?} must be a non-negative integer"))?;
    Ok((url.to_owned(), n))
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Some(Command::CheckConfig { file }) => check_config(&file),
        Some(Command::Explain(args)) => explain(args),
        None => serve(cli.run),
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    match Config::load(file) {
        Ok(config) => {
            println!(
                "{}: ok ({} workers, policy {}, min_load_gap {}, max_load_skew {})",
                file.display(),
                config.workers.len(),
                config.policy.kind,
                config.policy.min_load_gap,
                config.policy.max_load_skew
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn explain(args: ExplainArgs) -> ExitCode {
    let mut explainer = Explainer::new();
    if args.batch {
        return explain_batch(&mut explainer);
    }
    let scenario = Scenario {
        loads: args.loads.into_iter().collect(),
        healthy: args.unhealthy.iter().map(|u| (u.clone(), false)).collect(),
        workers: args.workers,
        routing_key: args.routing_key.unwrap_or_default(),
        explicit: !args.implicit,
        min_load_gap: args.min_load_gap,
        max_load_skew: args.max_load_skew,
        policy: args.policy,
    };
    match explainer.explain(&scenario) {
        Ok(answer) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).expect("answers serialise")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One `--batch` answer line: `{"worker","branch"}`.
#[derive(serde::Serialize)]
struct BatchAnswer {
    worker: Option<String>,
    branch: bch_core::policy::Branch,
}

/// One answer line per input line, in order. A bad line gets `{"error":..,"line":N}` and the rest
/// still run; the exit code is 1 if any line failed.
fn explain_batch(explainer: &mut Explainer) -> ExitCode {
    let stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed = false;
    for (index, line) in stdin.lines().enumerate() {
        let line_no = index + 1;
        let answer = match line {
            Err(e) => Err(format!("cannot read line: {e}")),
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => serde_json::from_str::<Scenario>(&line)
                .map_err(|e| format!("invalid scenario: {e}"))
                .and_then(|s| explainer.explain(&s).map_err(|e| e.to_string())),
        };
        let written = match answer {
            // A struct, not `json!`, so the fields come out in the documented order.
            Ok(a) => serde_json::to_writer(
                &mut out,
                &BatchAnswer {
                    worker: a.worker,
                    branch: a.branch,
                },
            ),
            Err(message) => {
                failed = true;
                serde_json::to_writer(
                    &mut out,
                    &serde_json::json!({"error": message, "line": line_no}),
                )
            }
        };
        if written.is_err() || out.write_all(b"\n").is_err() {
            return ExitCode::FAILURE;
        }
    }
    if out.flush().is_err() || failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Builds the effective configuration: file (or defaults) then flags.
pub fn effective_config(args: &RunArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    apply_flags(args, &mut config);
    config.validate()?;
    Ok(config)
}

/// Overrides the file's values with the flags that were given. Also applied to every reload, so
/// a flag keeps winning over the file after SIGHUP or `POST /admin/reload`.
pub fn apply_flags(args: &RunArgs, config: &mut Config) {
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(control) = args.control_listen {
        config.server.control_listen = control;
    }
    if let Some(kind) = args.policy {
        config.policy.kind = kind;
    }
    if let Some(gap) = args.min_load_gap {
        config.policy.min_load_gap = gap;
    }
    if let Some(skew) = args.max_load_skew {
        config.policy.max_load_skew = skew;
    }
    if let Some(file) = &args.admin_token_file {
        config.server.admin_token_file = Some(file.clone());
    }
    if let Some(path) = &args.health_path {
        config.health.path = path.clone();
    }
    if let Some(format) = args.log_format {
        config.log.format = format;
    }
}

fn init_logging(config: &Config) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
    // Colour only on a terminal: under systemd or a log shipper escapes would garble the lines.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match config.log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn serve(args: RunArgs) -> ExitCode {
    let mut config = match effective_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if args.demo && config.log.level == "info" {
        // One access-log line per request would bury the demo banner; warnings still show.
        config.log.level = "info,gatewayd::proxy=warn".to_owned();
    }
    init_logging(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let cli_workers: Vec<WorkerConfig> =
            args.workers.iter().map(|u| WorkerConfig::from_url(u)).collect();
        if args.demo {
            let mut config = config;
            // The demo exists to show spills: bounded unless the operator chose otherwise.
            if args.policy.is_none() && args.config.is_none() {
                config.policy.kind = PolicyKind::BoundedConsistentHashing;
            }
            // Ports the operator chose (flag, environment or file) are kept even when busy.
            let ports_chosen =
                args.listen.is_some() || args.control_listen.is_some() || args.config.is_some();
            return crate::demo::run(
                config,
                args.config.clone(),
                cli_workers,
                args.demo_workers,
                !ports_chosen,
            )
            .await;
        }
        if config.workers.is_empty() && cli_workers.is_empty() {
            tracing::warn!("no workers configured: every request gets 503 until one is added (POST /admin/workers or --worker URL)");
        }
        let running = Gateway::start(config, args.config.clone(), cli_workers).await?;
        let flags = args.clone();
        let _ = running
            .gateway
            .config_overrides
            .set(Box::new(move |config| apply_flags(&flags, config)));
        spawn_signal_handlers(std::sync::Arc::clone(&running.gateway))
            .context("cannot install signal handlers")?;
        eprintln!(
            "gatewayd: data plane http://{}  control plane http://{}  telemetry ws://{}/ws",
            running.data_addr, running.control_addr, running.control_addr
        );
        running.run_until_stopped().await;
        anyhow::Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM/SIGINT start a graceful shutdown; SIGHUP reloads the configuration file.
///
/// The handlers are registered before this returns (not inside the spawned tasks), so a signal
/// sent as soon as the start-up banner is out is handled instead of killing the process.
pub fn spawn_signal_handlers(gateway: std::sync::Arc<Gateway>) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let shutdown = gateway.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down: no new connections; draining in-flight requests");
        shutdown.cancel();
    });
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match gateway.reload() {
                Ok(()) => {}
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "reload failed; configuration unchanged")
                }
            }
        }
    });
    Ok(())
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
    fn listen_addresses_and_error_messages() {
        let err = Cli::try_parse_from(["gatewayd", "--listen", "localhost:8080"]).unwrap_err();
        assert!(err.to_string().contains("IP:PORT"), "{err}");
        let cli = Cli::parse_from(["gatewayd", "--config", "/nonexistent/gatewayd.toml"]);
        let text = format!("{:#}", effective_config(&cli.run).unwrap_err());
        assert_eq!(
            text.matches("No such file").count(),
            1,
            "the cause once: {text}"
        );
    }

    #[test]
    fn flags_override_the_file() {
        let cli = Cli::parse_from([
            "gatewayd",
            "--policy",
            "bounded_consistent_hashing",
            "--min-load-gap",
            "5",
            "--listen",
            "127.0.0.1:0",
        ]);
        let config = effective_config(&cli.run).unwrap();
        assert_eq!(config.policy.kind, PolicyKind::BoundedConsistentHashing);
        assert_eq!(config.policy.min_load_gap, 5);
        assert_eq!(config.server.listen.port(), 0);
        let bad = Cli::parse_from(["gatewayd", "--max-load-skew", "0.5"]);
        assert!(
            effective_config(&bad.run)
                .unwrap_err()
                .to_string()
                .contains("max_load_skew")
        );
    }
}
