//! The command line: clap types and dispatch. Without a subcommand gatewayd runs the proxy (or
//! `--demo`); `check-config FILE` runs every start-up check on a file; `reload` asks a running
//! gateway to re-read its file and fails when the reload does; `explain` is the offline what-if.

mod envoy_config;
mod envoy_tls;
mod envoy_worker_tls;
mod explain;
mod reload;
mod run_flags;
mod value_parsers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use bch_core::fleet_load::LoadSource;
use bch_core::policy::PolicyKind;
use clap::{Parser, Subcommand};

use crate::app::terminal::{print_err, print_out};
use crate::app::{StartOptions, init_logging};
use crate::config::{Config, LogFormat};
use envoy_config::EnvoyConfigArgs;
use explain::ExplainArgs;
use reload::ReloadArgs;
pub use run_flags::{PolicyFlags, RunArgs, ServerFlags, WorkerFlags};

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

/// What gatewayd can do besides running the proxy.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every start-up check that needs no socket on a configuration file (values, workers,
    /// token files, listeners) and report all problems; exit 1 if there is any.
    CheckConfig {
        /// The TOML file to validate.
        file: PathBuf,
    },
    /// Ask the running gateway to re-read its configuration file (POST /admin/reload); exit 1
    /// with the reason when the reload failed. Meant for systemd's ExecReload.
    Reload(ReloadArgs),
    /// Offline what-if: which worker and branch would a key get? Reserves nothing.
    Explain(ExplainArgs),
    /// Print an Envoy v3 bootstrap (YAML) that proxies through Envoy with this gatewayd as its
    /// endpoint picker; see docs/envoy.md.
    EnvoyConfig(EnvoyConfigArgs),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Some(Command::CheckConfig { file }) => check_config(&file),
        Some(Command::Reload(args)) => reload::reload(args),
        Some(Command::Explain(args)) => explain::explain(args),
        Some(Command::EnvoyConfig(args)) => envoy_config::print(&args),
        None => serve(cli.run),
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    let config = match Config::read(file) {
        Ok(config) => config,
        Err(e) => {
            print_err(format_args!("error: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let findings = crate::app::check(&StartOptions::new(config).config_file(file.to_owned()));
    for warning in &findings.warnings {
        print_err(format_args!("warning: {warning}"));
    }
    for error in &findings.errors {
        print_err(format_args!("error: {error}"));
    }
    let Some(config) = findings.config else {
        print_err(format_args!(
            "{}: {} problem(s); gatewayd would not start",
            file.display(),
            findings.errors.len()
        ));
        return ExitCode::FAILURE;
    };
    let sources = match config.discovery.len() {
        0 => String::new(),
        1 => ", 1 discovery source".to_owned(),
        n => format!(", {n} discovery sources"),
    };
    let printed = print_out(format_args!(
        "{}: ok ({} workers{sources}, policy {}, min_load_gap {}, max_load_skew {}, spill_order {}, load_source {}{})\n",
        file.display(),
        config.workers.len(),
        config.policy.kind,
        config.policy.min_load_gap,
        config.policy.max_load_skew,
        config.policy.spill_order,
        config.load.source,
        match config.load.source {
            LoadSource::WorkerMetrics => format!(
                " every {} ms",
                crate::config::millis::as_millis(config.load.scrape_interval)
            ),
            LoadSource::Local => String::new(),
        }
    ));
    match printed {
        Ok(()) => ExitCode::SUCCESS,
        Err(closed) => closed.exit(),
    }
}

/// The file's contents (or defaults), before the flags; parsed, not yet validated (start-up
/// reports every problem at once).
fn base_config(args: &RunArgs) -> anyhow::Result<Config> {
    Ok(match &args.config {
        Some(path) => Config::read(path)?,
        None => Config::default(),
    })
}

/// The start options the command line describes: the file read once, the flags as overrides
/// (at start and on every reload), `--worker`s pinned, signal handlers on.
fn start_options(args: &RunArgs) -> anyhow::Result<StartOptions> {
    args.check()?;
    let mut base = base_config(args)?;
    if args.demo && args.policy.policy.is_none() && args.config.is_none() {
        // The demo exists to show spills: bounded unless the operator chose otherwise.
        base.policy.kind = PolicyKind::BoundedConsistentHashing;
    }
    let flags = args.clone();
    let mut options = StartOptions::new(base)
        .overrides(Arc::new(move |config| flags.apply(config)))
        .pinned_workers(args.workers.pinned())
        .handle_signals();
    if let Some(path) = &args.config {
        options = options.config_file(path.clone());
    }
    Ok(options)
}

fn serve(args: RunArgs) -> ExitCode {
    // Before the file is read only the flag can say JSON; an error then is still one JSON line.
    let json_flag = args.log_format == Some(LogFormat::Json);
    let options = match start_options(&args) {
        Ok(options) => options,
        Err(e) => return fail(json_flag, &format!("{e:#}")),
    };
    // The configuration that will be in force, not validated: `app::start` checks everything and
    // reports every problem, as `check-config` does. Here it gives the log settings and banner.
    let mut config = options.effective_unvalidated();
    let json = config.log.format == LogFormat::Json;
    if args.demo && config.log.level == "info" {
        // One access-log line per request would bury the demo banner; warnings still show.
        config.log.level = format!("info,{}=warn", crate::routing::exchange::ACCESS_LOG);
    }
    init_logging(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(json, &format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(async move {
        if args.demo {
            return demo(&args, options, !json).await;
        }
        if config.workers.is_empty() && config.discovery.is_empty() {
            tracing::warn!("no workers configured: every request gets 503 until one is added (POST /admin/workers, --worker URL or --discover-dns NAME)");
        }
        let running = crate::app::start(options).await?;
        if !json {
            // In JSON mode the `gatewayd started` log line carries the addresses: a shipper that
            // parses every line as JSON gets nothing else.
            let data = match config.server.listeners.data_plane {
                true => format!("data plane http://{}  ", running.data_addr),
                false => String::new(),
            };
            let picker = match running.picker_addr {
                Some(addr) => format!("  endpoint picker grpc://{addr}"),
                None => String::new(),
            };
            print_err(format_args!(
                "gatewayd: {data}control plane http://{}  telemetry ws://{}/ws{picker}",
                running.control_addr, running.control_addr
            ));
        }
        running.run_until_stopped().await;
        anyhow::Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(json, &format!("{e:#}")),
    }
}

/// Reports a fatal error on stderr: `error: …` for people, one JSON object in JSON log mode (also
/// before the subscriber exists, so a shipper never meets a line it cannot parse).
fn fail(json: bool, message: &str) -> ExitCode {
    if json {
        let line = serde_json::json!({
            "timestamp": rfc3339_now(),
            "level": "ERROR",
            "fields": {"message": message},
            "target": "gatewayd",
        });
        print_err(format_args!("{line}"));
    } else {
        print_err(format_args!("error: {message}"));
    }
    ExitCode::FAILURE
}

/// The current UTC time as RFC 3339 with microseconds (`2026-01-01T12:00:00.000000Z`), the
/// format of the JSON log's other lines.
fn rfc3339_now() -> String {
    rfc3339(std::time::SystemTime::now())
}

/// `at` as RFC 3339 UTC with microseconds; a clock set before 1970 reads as the epoch (humantime
/// would panic on it, and a log line is no reason to stop).
fn rfc3339(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_micros(at.max(std::time::UNIX_EPOCH)).to_string()
}

#[cfg(feature = "demo")]
async fn demo(args: &RunArgs, options: StartOptions, banner: bool) -> anyhow::Result<()> {
    // Ports the operator chose (flag, environment or file) are kept even when busy.
    let ports_chosen = args.server.listen.is_some()
        || args.server.control_listen.is_some()
        || args.config.is_some();
    crate::demo::run(options, args.demo_workers, !ports_chosen, banner).await
}

#[cfg(not(feature = "demo"))]
async fn demo(_args: &RunArgs, _options: StartOptions, _banner: bool) -> anyhow::Result<()> {
    anyhow::bail!("this gatewayd was built without the demo (cargo feature \"demo\")")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The configuration the command line puts in force, validated.
    fn effective_config(args: &RunArgs) -> anyhow::Result<Config> {
        let config = start_options(args)?.effective_unvalidated();
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn json_error_lines_carry_an_rfc3339_time() {
        let epoch = std::time::UNIX_EPOCH;
        let at = epoch + std::time::Duration::from_micros(1_700_000_000_000_042);
        assert_eq!(rfc3339(at), "2023-11-14T22:13:20.000042Z");
        assert_eq!(rfc3339(epoch), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(epoch + std::time::Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000000Z"
        );
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
        assert_eq!(config.server.listeners.listen.port(), 0);
        let bad = Cli::parse_from(["gatewayd", "--max-load-skew", "0.5"]);
        assert!(
            effective_config(&bad.run)
                .unwrap_err()
                .to_string()
                .contains("max_load_skew")
        );
    }
}
