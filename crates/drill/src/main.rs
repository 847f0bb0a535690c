//! `bch-drill`: simulated workers, storms and A/B runs against a bch gateway. The command line only:
//! every subcommand is a thin shell over the library (docs/drill.md). The flags are defined here;
//! `commands/` runs each subcommand.
#![forbid(unsafe_code)]

mod commands;
mod rate;
mod tls_flags;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use bch_core::routing_key::DEFAULT_ROUTING_KEY_HEADER;
use bch_drill::sim::{DEFAULT_MODEL, SimConfig};
use bch_drill::storm::{PrefixScope, StormConfig};
use clap::{Args, Parser, Subcommand};
use reqwest::Url;
use tokio_util::sync::CancellationToken;

/// Drills for a bch gateway: simulated OpenAI-compatible workers, storms of sibling requests sharing
/// routing keys, and A/B comparisons of routing policies.
///
/// A repeated option takes its last value, so a wrapper script's defaults can be overridden by
/// arguments appended after them (`tests/sim/ab.sh original --reps 3`).
#[derive(Debug, Parser)]
#[command(name = "bch-drill", version, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run simulated workers until Ctrl-C.
    Workers(WorkersArgs),
    /// Fire one storm at a gateway and report.
    Storm(StormArgs),
    /// Compare routing policies: switch the gateway's policy between cells and storm each.
    Ab(AbArgs),
    /// Find the fleet's capacity: open-loop storms at rising rates until goodput stops rising.
    Sweep(rate::SweepArgs),
}

#[derive(Debug, Args)]
struct WorkersArgs {
    /// How many workers to start; they are named sim-0, sim-1, …
    #[arg(long, default_value_t = 3)]
    count: usize,
    /// Port of the first worker; the others take the ports after it. 0 picks free ports.
    #[arg(long, default_value_t = 8001)]
    base_port: u16,
    /// Address the workers listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Serve https with this PEM certificate chain (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS; with --tls-cert).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    #[command(flatten)]
    sim: SimArgs,
}

/// Simulator parameters; each overrides the `--sim-config` file, which overrides the defaults.
#[derive(Debug, Args)]
struct SimArgs {
    /// TOML file with any of the simulator's parameters (see docs/drill.md); the flags below
    /// override it.
    #[arg(long, value_name = "FILE")]
    sim_config: Option<PathBuf>,
    /// Factor applied to every simulated duration: 0.1 runs ten times faster, and 0 never sleeps
    /// (instant mode).
    #[arg(long)]
    time_scale: Option<f64>,
    /// Seed of the generated text: the same seed and prompt give the same completion on every
    /// worker.
    #[arg(long)]
    seed: Option<u64>,
    /// Requests each worker decodes at once; later ones wait in a first-in first-out queue.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Tokens per prefix-cache block; only full blocks are cached.
    #[arg(long)]
    block_size: Option<usize>,
    /// Prefix-cache capacity of each worker, in blocks; 0 disables the cache.
    #[arg(long)]
    cache_blocks: Option<usize>,
    /// Prefill throughput of each worker in prompt tokens per second, shared by the prefills of an
    /// engine step; inf makes prefill free.
    #[arg(long)]
    prefill_tokens_per_s: Option<f64>,
    /// Prompt tokens one engine step may carry, decode tokens included; longer prefills are split
    /// into chunks. Keep it at least --max-batch, or decodes crowd out prefill.
    #[arg(long)]
    chunk_tokens: Option<usize>,
    /// Time of an engine step with one decoding request, in milliseconds.
    #[arg(long)]
    decode_base_ms: Option<f64>,
    /// Extra engine step time for each further decoding request, in milliseconds.
    #[arg(long)]
    decode_per_running_ms: Option<f64>,
    /// Let a request compute a prefix that another running request is already computing, instead
    /// of waiting for it and hitting the cache.
    #[arg(long)]
    no_prefix_wait: bool,
}

impl SimArgs {
    fn config(&self) -> anyhow::Result<SimConfig> {
        let mut c = match &self.sim_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                toml::from_str(&text).with_context(|| format!("in {}", path.display()))?
            }
            None => SimConfig::default(),
        };
        let set = |target: &mut f64, v: Option<f64>| {
            if let Some(v) = v {
                *target = v;
            }
        };
        set(&mut c.time_scale, self.time_scale);
        set(&mut c.prefill_tokens_per_s, self.prefill_tokens_per_s);
        c.chunk_tokens = self.chunk_tokens.unwrap_or(c.chunk_tokens);
        if self.no_prefix_wait {
            c.wait_for_shared_prefix = false;
        }
        set(&mut c.decode_step_base_ms, self.decode_base_ms);
        set(
            &mut c.decode_step_per_running_ms,
            self.decode_per_running_ms,
        );
        c.seed = self.seed.unwrap_or(c.seed);
        c.max_batch = self.max_batch.unwrap_or(c.max_batch);
        c.block_size = self.block_size.unwrap_or(c.block_size);
        c.cache_capacity_blocks = self.cache_blocks.unwrap_or(c.cache_capacity_blocks);
        c.validate()?;
        Ok(c)
    }
}

/// The storm's shape, shared by `storm` and `ab`.
#[derive(Debug, Args)]
struct StormOpts {
    /// Data-plane URL of the gateway (or of one worker, for a baseline). Several replicas in front
    /// of one fleet: `A,B,C`, and requests go round-robin over them, as an L4 balancer would spread
    /// them.
    #[arg(long, env = "BCH_GATEWAY", value_delimiter = ',', required = true)]
    gateway: Vec<Url>,
    /// Groups of sibling requests to fire.
    #[arg(long, default_value_t = StormConfig::default().groups)]
    groups: usize,
    /// Concurrent requests per group, all with the group's routing key.
    #[arg(long, default_value_t = StormConfig::default().siblings)]
    siblings: usize,
    /// Distinct routing keys; groups cycle over them.
    #[arg(long, default_value_t = StormConfig::default().keys)]
    keys: usize,
    /// Groups in flight at once; the next group starts when one finishes (closed loop, without
    /// --rate).
    #[arg(long, default_value_t = StormConfig::default().concurrency)]
    concurrency: usize,
    /// Ask for whole responses instead of SSE streams (TTFT is then the full response time).
    #[arg(long)]
    no_stream: bool,
    /// Prompt tokens of the shared prefix.
    #[arg(long, default_value_t = StormConfig::default().prefix_tokens)]
    prefix_tokens: usize,
    /// Who shares the prefix: key (every group of a routing key, like a long-lived session) or
    /// group (only the siblings of one group: every group brings a new prefix, like n samples of
    /// one prompt in RL rollouts).
    #[arg(long, value_parser = parse_scope, default_value = "key")]
    prefix_scope: PrefixScope,
    /// Make the first N keys hot: they take --hot-share of the groups and the other keys the rest,
    /// each group's key drawn from the seed. 0 cycles the groups over the keys in turn.
    #[arg(long, default_value_t = 0)]
    hot_keys: usize,
    /// Share of the groups, 0 to 1, that go to the hot keys.
    #[arg(long, default_value_t = StormConfig::default().hot_share)]
    hot_share: f64,
    /// Prompt tokens distinct to each request.
    #[arg(long, default_value_t = StormConfig::default().suffix_tokens)]
    suffix_tokens: usize,
    /// Completion tokens each request asks for (its `max_tokens`).
    #[arg(long, default_value_t = StormConfig::default().max_tokens)]
    max_tokens: u32,
    /// Request header that carries the routing key.
    #[arg(long, default_value = DEFAULT_ROUTING_KEY_HEADER)]
    routing_key_header: String,
    /// Model name sent in requests.
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Seed of the prompt text (and of a hot-key storm's key sequence); the routing key names do
    /// not depend on it. Unless given, every invocation draws its own, so a second invocation does
    /// not find the first one's prompts in the workers' caches.
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds after which a request is given up, from sending it to its last byte.
    #[arg(long, default_value_t = StormConfig::default().request_timeout.as_secs())]
    timeout_s: u64,
    /// Bearer token for the control plane, when it requires one. Visible to anyone who can list
    /// processes: prefer --control-token-file.
    #[arg(long, env = "BCH_CONTROL_TOKEN", hide_env_values = true)]
    control_token: Option<String>,
    /// File holding the control plane's bearer token (gatewayd's admin_token_file; surrounding
    /// whitespace is ignored), so the token never shows in `ps`.
    #[arg(long, env = "BCH_CONTROL_TOKEN_FILE", conflicts_with = "control_token")]
    control_token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    tls: tls_flags::TlsFlags,
}

fn parse_scope(s: &str) -> Result<PrefixScope, String> {
    s.parse()
}

impl StormOpts {
    /// The control plane token: `--control-token`, or the contents of `--control-token-file`.
    fn control_token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.control_token_file else {
            return Ok(self.control_token.clone());
        };
        // bch-drill's one token-file reader; the parsing is bch-core's, shared by every binary.
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--control-token-file {}", path.display()))?;
        let token = bch_core::token::bearer_token(&text).map_err(
            |bch_core::token::TokenError::Empty| {
                anyhow::anyhow!("--control-token-file {} is empty", path.display())
            },
        )?;
        Ok(Some(token))
    }

    /// The seed given, or a fresh one for this invocation (32 bits: short enough to type back).
    fn seed(&self) -> u64 {
        self.seed
            .unwrap_or_else(|| u64::from(rand::random::<u32>()))
    }

    fn config(&self, control: Option<Url>, seed: u64) -> StormConfig {
        StormConfig {
            gateway: self.gateway[0].clone(),
            replicas: self.gateway[1..].to_vec(),
            groups: self.groups,
            siblings: self.siblings,
            keys: self.keys,
            concurrency: self.concurrency,
            stream: !self.no_stream,
            prefix_tokens: self.prefix_tokens,
            prefix_scope: self.prefix_scope,
            hot_keys: self.hot_keys,
            hot_share: self.hot_share,
            suffix_tokens: self.suffix_tokens,
            max_tokens: self.max_tokens,
            routing_key_header: self.routing_key_header.clone(),
            model: self.model.clone(),
            control,
            control_token: self.control_token().ok().flatten(),
            seed,
            request_timeout: Duration::from_secs(self.timeout_s),
            ..StormConfig::default()
        }
    }
}

#[derive(Debug, Args)]
struct StormArgs {
    #[command(flatten)]
    storm: StormOpts,
    #[command(flatten)]
    open_loop: rate::OpenLoopArgs,
    /// Write every request as a JSON line to this file: send time, lateness, key, status,
    /// worker, branch, TTFT, total time, Retry-After, error code, queue wait, class.
    #[arg(long, value_name = "FILE")]
    records: Option<PathBuf>,
    /// Control-plane URL; when given, the report checks that every worker's active load returns to
    /// 0. With several replicas, every replica's control plane: `A,B,C`. One that cannot be asked
    /// is named in the report.
    #[arg(long, env = "BCH_CONTROL", value_delimiter = ',')]
    control: Vec<Url>,
    /// With several replicas: stop sending to a replica once a connection to it is refused, and
    /// send the refused request to the next replica, as an L4 balancer would. The replica stays
    /// out until the storm ends.
    #[arg(long)]
    eject_refused_replicas: bool,
    /// Also write the report as JSON to this file (written before the report is printed, so a
    /// closed stdout never costs the file).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct AbArgs {
    #[command(flatten)]
    storm: StormOpts,
    #[command(flatten)]
    open_loop: rate::OpenLoopArgs,
    /// Control-plane URL of the gateway; the policy is switched there between cells. With several
    /// replicas, every replica's control plane (`A,B,C`): the policy is switched on each.
    #[arg(long, env = "BCH_CONTROL", value_delimiter = ',', required = true)]
    control: Vec<Url>,
    /// Cells separated by `,`, options within a cell by `:`; the first cell is the baseline.
    /// E.g. `strict,gap=1,gap=2:skew=1.25`.
    #[arg(long, default_value = "strict,gap=1,gap=2,gap=4")]
    cells: String,
    /// Repetitions of every cell; every other repetition runs the cells in reverse, so a drift of
    /// the machine cancels.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Also draw throughput and TTFT per cell: SVG for a `.svg` file, PNG otherwise.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Prints a report on stdout. A failed write (a pipe whose reader is gone, `| head -1`) is an error
/// to report, where `print!` would panic.
fn print_report(report: &impl std::fmt::Display) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{report}")
        .and_then(|()| stdout.flush())
        .context("writing the report to standard output")
}

/// One error out of the results of a command's outputs (report file, chart, stdout), each tried
/// whatever became of the others: the first error, with the others' messages after it.
fn all_written(results: impl IntoIterator<Item = anyhow::Result<()>>) -> anyhow::Result<()> {
    let errors: Vec<anyhow::Error> = results.into_iter().filter_map(Result::err).collect();
    let mut errors = errors.into_iter();
    match errors.next() {
        None => Ok(()),
        Some(first) => {
            let rest: Vec<String> = errors.map(|e| format!("{e:#}")).collect();
            if rest.is_empty() {
                Err(first)
            } else {
                Err(anyhow::anyhow!("{first:#}; {}", rest.join("; ")))
            }
        }
    }
}

/// A line on stderr for a person watching (progress, notes, the final error). It is lost, nothing
/// more, when stderr cannot be written: `eprintln!` would panic.
macro_rules! note {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use note;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // A log line that cannot be written is lost, nothing more; by default the subscriber
        // reports the failure with `eprintln!`, which panics on the same broken stderr.
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let cancel = CancellationToken::new();
    let result = match cli.command {
        Command::Workers(args) => commands::workers::run(args).await,
        Command::Storm(args) => commands::storm::run(args, cancel.clone()).await,
        Command::Ab(args) => commands::ab::run(args, cancel.clone()).await,
        Command::Sweep(args) => commands::sweep::run(args, cancel.clone()).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the context chain joined by ": ".
            note!("bch-drill: error: {e:#}");
            if cancel.is_cancelled() {
                // 128 + SIGINT, as shells report an interrupted command.
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_drill::ab::parse_cells;
    use clap::CommandFactory as _;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_control_token_can_come_from_a_file_and_never_from_both() {
        let path = std::env::temp_dir().join(format!("bch-drill-token-{}", std::process::id()));
        std::fs::write(&path, "  file-token\n").unwrap();
        let base = ["bch-drill", "storm", "--gateway", "http://127.0.0.1:8080"];
        let cli = Cli::try_parse_from(
            base.iter()
                .copied()
                .chain(["--control-token-file", path.to_str().unwrap()]),
        )
        .unwrap();
        let Command::Storm(args) = cli.command else {
            panic!("not storm")
        };
        assert_eq!(
            args.storm.control_token().unwrap().as_deref(),
            Some("file-token")
        );
        assert_eq!(
            args.storm.config(None, 1).control_token.as_deref(),
            Some("file-token")
        );
        let both = Cli::try_parse_from(base.iter().copied().chain([
            "--control-token",
            "t",
            "--control-token-file",
            path.to_str().unwrap(),
        ]));
        assert!(both.is_err(), "one or the other");
        std::fs::write(&path, "\n").unwrap();
        let cli = Cli::try_parse_from(
            base.iter()
                .copied()
                .chain(["--control-token-file", path.to_str().unwrap()]),
        )
        .unwrap();
        let Command::Storm(args) = cli.command else {
            panic!("not storm")
        };
        assert!(
            args.storm
                .control_token()
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn storm_and_ab_options_parse() {
        let cli = Cli::try_parse_from([
            "bch-drill",
            "ab",
            "--gateway",
            "http://127.0.0.1:8080",
            "--control",
            "http://127.0.0.1:9090",
            "--cells",
            "strict,gap=2:skew=1.25",
            "--reps",
            "3",
            "--no-stream",
            "--plot",
            "ab.svg",
        ])
        .unwrap();
        let Command::Ab(args) = cli.command else {
            panic!("not ab")
        };
        assert_eq!(args.reps, 3);
        assert!(!args.storm.config(None, 1).stream);
        assert_eq!(parse_cells(&args.cells).unwrap().len(), 2);

        let cli = Cli::try_parse_from([
            "bch-drill",
            "ab",
            "--gateway",
            "http://127.0.0.1:8080",
            "--control",
            "http://127.0.0.1:9090",
            "--cells",
            "strict,gap=2",
            "--reps",
            "5",
            "--cells",
            "strict,gap=0:skew=1,gap=6",
            "--reps",
            "3",
        ])
        .unwrap();
        let Command::Ab(args) = cli.command else {
            panic!("not ab")
        };
        assert_eq!((args.reps, parse_cells(&args.cells).unwrap().len()), (3, 3));

        let cli = Cli::try_parse_from([
            "bch-drill",
            "storm",
            "--gateway",
            "http://127.0.0.1:8080,http://127.0.0.1:8081",
            "--control",
            "http://127.0.0.1:9090,http://127.0.0.1:9091",
        ])
        .unwrap();
        let Command::Storm(replicated) = cli.command else {
            panic!("not storm")
        };
        let config = replicated
            .storm
            .config(replicated.control.first().cloned(), 1);
        assert_eq!(config.gateways().count(), 2);
        assert_eq!(replicated.control.len(), 2);

        let cli = Cli::try_parse_from(["bch-drill", "storm", "--gateway", "http://127.0.0.1:8080"])
            .unwrap();
        let Command::Storm(args) = cli.command else {
            panic!("not storm")
        };
        let config = args.storm.config(None, 1);
        assert_eq!(config.control_token, None);
        assert_eq!((config.groups, config.siblings, config.keys), (400, 8, 8));
        assert!(config.stream);
        assert_eq!(config.prefix_scope, PrefixScope::Key);
        assert_eq!(
            args.storm.seed, None,
            "no --seed: each invocation draws its own"
        );

        let cli = Cli::try_parse_from([
            "bch-drill",
            "storm",
            "--gateway",
            "http://127.0.0.1:8080",
            "--prefix-scope",
            "group",
            "--hot-keys",
            "2",
            "--seed",
            "7",
        ])
        .unwrap();
        let Command::Storm(args) = cli.command else {
            panic!("not storm")
        };
        let config = args.storm.config(None, args.storm.seed());
        assert_eq!(
            (config.prefix_scope, config.hot_keys, config.seed),
            (PrefixScope::Group, 2, 7)
        );
        assert!(
            Cli::try_parse_from([
                "bch-drill",
                "storm",
                "--gateway",
                "http://a",
                "--prefix-scope",
                "turn"
            ])
            .is_err()
        );
    }

    #[test]
    fn simulator_flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sim.toml");
        std::fs::write(&file, "time_scale = 0.5\nmax_batch = 4\n").unwrap();
        let cli = Cli::try_parse_from([
            "bch-drill",
            "workers",
            "--sim-config",
            file.to_str().unwrap(),
            "--max-batch",
            "8",
        ])
        .unwrap();
        let Command::Workers(args) = cli.command else {
            panic!("not workers")
        };
        let config = args.sim.config().unwrap();
        assert_eq!((config.time_scale, config.max_batch), (0.5, 8));

        std::fs::write(&file, "time_scael = 0.5\n").unwrap();
        let error = format!("{:#}", args.sim.config().unwrap_err());
        assert!(error.contains("time_scael"), "{error}");
    }
}
