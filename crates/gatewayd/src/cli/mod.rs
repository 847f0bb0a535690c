//! The command line: clap types and dispatch. Without a subcommand gatewayd runs the proxy (or
//! `--demo`); `check-config FILE` runs every start-up check on a file; `reload` asks a running
//! gateway to re-read its file and fails when the reload does; `explain` is the offline what-if.

mod envoy_config;
mod explain;
mod reload;
mod value_parsers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use bch_core::policy::{PolicyKind, SpillOrder};
use clap::{Args, Parser, Subcommand};

use crate::app::{StartOptions, init_logging};
use crate::config::{Config, DiscoveryConfig, DnsKind, LogFormat, WorkerConfig};
use bch_core::fleet_load::LoadSource;
use envoy_config::EnvoyConfigArgs;
use explain::ExplainArgs;
use reload::ReloadArgs;
use value_parsers::{parse_addr, parse_load_source, parse_policy, parse_spill_order};

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

/// Options of the proxy. Flags override the configuration file, at start and on every reload.
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
    /// Serve Envoy's endpoint picker (ext_proc over plaintext gRPC) on this address; workers must
    /// then be http://IP:PORT URLs.
    #[arg(long, env = "GATEWAYD_PICKER_LISTEN", value_name = "IP:PORT", value_parser = parse_addr)]
    pub picker_listen: Option<SocketAddr>,
    /// Serve no data plane: run only as Envoy's endpoint picker (needs --picker-listen).
    #[arg(long)]
    pub no_data_plane: bool,
    /// Worker base URL; repeat for more workers (added after the file's workers, kept on reload).
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// DNS name whose records are workers: SRV when it begins with '_', else A/AAAA; repeat for
    /// more names (added after the file's [[discovery]] entries, kept on reload).
    #[arg(long = "discover-dns", value_name = "NAME")]
    pub discover_dns: Vec<String>,
    /// The workers' port for the A/AAAA names of --discover-dns (SRV records carry their own).
    #[arg(long, value_name = "PORT", requires = "discover_dns")]
    pub discover_port: Option<u16>,
    /// The DNS server the --discover-dns names are resolved with, as IP:PORT [default: the
    /// system's resolver configuration].
    #[arg(long, value_name = "IP:PORT", value_parser = parse_addr, requires = "discover_dns")]
    pub dns_resolver: Option<SocketAddr>,
    /// Longest time between two resolutions of a --discover-dns name, in milliseconds; an answer
    /// whose TTL runs out sooner is asked again sooner [default: 5000].
    #[arg(long, value_name = "MS", requires = "discover_dns")]
    pub discovery_interval_ms: Option<u64>,
    /// Routing policy: consistent_hashing (default), bounded_consistent_hashing, round_robin or
    /// random.
    #[arg(long, value_parser = parse_policy)]
    pub policy: Option<PolicyKind>,
    /// Bounded policy: in-flight requests the preferred worker may exceed the fleet minimum by
    /// before a key can spill.
    #[arg(long)]
    pub min_load_gap: Option<u64>,
    /// Bounded policy: factor over the fleet mean load the preferred worker must exceed before a
    /// key can spill (finite, at least 1.0).
    #[arg(long)]
    pub max_load_skew: Option<f64>,
    /// Bounded policy: where a spilled request goes among the workers under the bound: ring (the
    /// next one clockwise, the default) or hash_seeded (a per-key pseudo-random order).
    #[arg(long, value_parser = parse_spill_order)]
    pub spill_order: Option<SpillOrder>,
    /// Which load the bounded rule reads: local (this process's in-flight requests) or
    /// worker_metrics (the workers' own gauges, so several replicas decide as one).
    #[arg(long, value_parser = parse_load_source)]
    pub load_source: Option<LoadSource>,
    /// File holding the control plane's bearer token.
    #[arg(long, env = "GATEWAYD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Health probe path for every worker without its own (e.g. /v1/models for llama.cpp).
    #[arg(long)]
    pub health_path: Option<String>,
    /// Log format: text for people, json for log shippers.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Run the demo: embedded simulated workers, a gentle background storm, bounded policy.
    #[arg(long)]
    pub demo: bool,
    /// How many simulated workers the demo starts (1 to 64).
    #[arg(long, default_value_t = 4, requires = "demo")]
    pub demo_workers: usize,
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
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let findings = crate::app::check(&StartOptions::new(config).config_file(file.to_owned()));
    for warning in &findings.warnings {
        eprintln!("warning: {warning}");
    }
    for error in &findings.errors {
        eprintln!("error: {error}");
    }
    let Some(config) = findings.config else {
        eprintln!(
            "{}: {} problem(s); gatewayd would not start",
            file.display(),
            findings.errors.len()
        );
        return ExitCode::FAILURE;
    };
    let sources = match config.discovery.len() {
        0 => String::new(),
        1 => ", 1 discovery source".to_owned(),
        n => format!(", {n} discovery sources"),
    };
    println!(
        "{}: ok ({} workers{sources}, policy {}, min_load_gap {}, max_load_skew {}, spill_order {}, load_source {}{})",
        file.display(),
        config.workers.len(),
        config.policy.kind,
        config.policy.min_load_gap,
        config.policy.max_load_skew,
        config.policy.spill_order,
        config.load.source,
        match config.load.source {
            LoadSource::WorkerMetrics => format!(" every {} ms", config.load.scrape_interval_ms),
            LoadSource::Local => String::new(),
        }
    );
    ExitCode::SUCCESS
}

/// The file's contents (or defaults), before the flags; parsed, not yet validated (start-up
/// reports every problem at once).
fn base_config(args: &RunArgs) -> anyhow::Result<Config> {
    Ok(match &args.config {
        Some(path) => Config::read(path)?,
        None => Config::default(),
    })
}

/// Builds the effective configuration: file (or defaults) then flags, validated.
pub fn effective_config(args: &RunArgs) -> anyhow::Result<Config> {
    check_flags(args)?;
    let mut config = base_config(args)?;
    apply_flags(args, &mut config);
    config.validate()?;
    Ok(config)
}

/// Refuses flags that make no sense together, naming the flag (the `[[discovery]]` error a
/// flag would otherwise turn into names a field the operator never wrote).
fn check_flags(args: &RunArgs) -> anyhow::Result<()> {
    if args.discover_port.is_none()
        && let Some(name) = args.discover_dns.iter().find(|n| !n.starts_with('_'))
    {
        anyhow::bail!(
            "--discover-dns {name} is an A/AAAA name: give the workers' port with --discover-port PORT (or use an SRV name, which begins with '_')"
        );
    }
    Ok(())
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
    if let Some(picker) = args.picker_listen {
        config.picker.listen = Some(picker);
    }
    if args.no_data_plane {
        config.server.data_plane = false;
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
    if let Some(order) = args.spill_order {
        config.policy.spill_order = order;
    }
    if let Some(source) = args.load_source {
        config.load.source = source;
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
    config.discovery.extend(
        args.discover_dns
            .iter()
            .map(|name| discovery_source(args, name)),
    );
}

/// The `[[discovery]]` entry of one `--discover-dns NAME`.
fn discovery_source(args: &RunArgs, name: &str) -> DiscoveryConfig {
    let mut source = DiscoveryConfig::new(name);
    if source.kind() == DnsKind::Address {
        source.port = args.discover_port;
    }
    source.resolver = args.dns_resolver;
    if let Some(interval) = args.discovery_interval_ms {
        source.interval_ms = interval;
    }
    source
}

/// The start options the flags describe: the file, the flags as overrides, `--worker`s pinned,
/// signal handlers on.
fn start_options(args: &RunArgs, mut base: Config) -> StartOptions {
    if args.demo && args.policy.is_none() && args.config.is_none() {
        // The demo exists to show spills: bounded unless the operator chose otherwise.
        base.policy.kind = PolicyKind::BoundedConsistentHashing;
    }
    let flags = args.clone();
    let mut options = StartOptions::new(base)
        .overrides(Arc::new(move |config| apply_flags(&flags, config)))
        .pinned_workers(
            args.workers
                .iter()
                .map(|u| WorkerConfig::from_url(u))
                .collect(),
        )
        .handle_signals();
    if let Some(path) = &args.config {
        options = options.config_file(path.clone());
    }
    options
}

fn serve(args: RunArgs) -> ExitCode {
    // Before the file is read only the flag can say JSON; an error then is still one JSON line.
    let json_flag = args.log_format == Some(LogFormat::Json);
    if let Err(e) = check_flags(&args) {
        return fail(json_flag, &format!("{e:#}"));
    }
    // Parsed with the flags applied, not validated: `app::start` checks everything and reports
    // every problem, as `check-config` does.
    let mut config = match base_config(&args) {
        Ok(mut c) => {
            apply_flags(&args, &mut c);
            c
        }
        Err(e) => return fail(json_flag, &format!("{e:#}")),
    };
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
        let options = start_options(&args, base_config(&args)?);
        if args.demo {
            return demo(&args, options, !json).await;
        }
        if config.workers.is_empty() && args.workers.is_empty() && config.discovery.is_empty() {
            tracing::warn!("no workers configured: every request gets 503 until one is added (POST /admin/workers, --worker URL or --discover-dns NAME)");
        }
        let running = crate::app::start(options).await?;
        if !json {
            // In JSON mode the `gatewayd started` log line carries the addresses: a shipper that
            // parses every line as JSON gets nothing else.
            let data = match config.server.data_plane {
                true => format!("data plane http://{}  ", running.data_addr),
                false => String::new(),
            };
            let picker = match running.picker_addr {
                Some(addr) => format!("  endpoint picker grpc://{addr}"),
                None => String::new(),
            };
            eprintln!(
                "gatewayd: {data}control plane http://{}  telemetry ws://{}/ws{picker}",
                running.control_addr, running.control_addr
            );
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
        eprintln!("{line}");
    } else {
        eprintln!("error: {message}");
    }
    ExitCode::FAILURE
}

/// The current UTC time as RFC 3339 with microseconds (`2026-01-01T12:00:00.000000Z`), the
/// format of the JSON log's other lines.
fn rfc3339_now() -> String {
    rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// `now` (since the Unix epoch) as RFC 3339 UTC with microseconds.
fn rfc3339(now: std::time::Duration) -> String {
    let secs = now.as_secs();
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        (rest / 60) % 60,
        rest % 60,
        now.subsec_micros()
    )
}

#[cfg(feature = "demo")]
async fn demo(args: &RunArgs, options: StartOptions, banner: bool) -> anyhow::Result<()> {
    // Ports the operator chose (flag, environment or file) are kept even when busy.
    let ports_chosen =
        args.listen.is_some() || args.control_listen.is_some() || args.config.is_some();
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

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn json_error_lines_carry_an_rfc3339_time() {
        let at = std::time::Duration::from_micros(1_700_000_000_000_042);
        assert_eq!(rfc3339(at), "2023-11-14T22:13:20.000042Z");
        assert_eq!(
            rfc3339(std::time::Duration::ZERO),
            "1970-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            rfc3339(std::time::Duration::from_secs(951_782_400)),
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
