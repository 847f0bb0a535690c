//! The checked inputs of `gatewayd envoy-config`: its flags, and the [`EnvoyPlan`] made from
//! them and gatewayd's configuration, validated as gatewayd validates it at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bch_core::routing_key::IMPLICIT_KEY_HEADERS;
use clap::Args;

use crate::cli::envoy_tls::{EnvoyPickerTlsArgs, PickerTlsPlan};
use crate::cli::envoy_worker_tls::{EnvoyWorkerTlsArgs, WorkerTlsPlan};
use crate::cli::value_parsers::parse_addr;
use crate::config::{Config, WorkerConfig};
use crate::picker::messages::REQUEST_ID_HEADER;

/// `gatewayd envoy-config` options.
#[derive(Debug, Args)]
pub struct EnvoyConfigArgs {
    /// Address Envoy serves clients on.
    #[arg(long, value_name = "IP:PORT", value_parser = parse_addr)]
    pub listen: SocketAddr,
    /// Address of gatewayd's endpoint picker (its --picker-listen).
    #[arg(long, value_name = "IP:PORT", value_parser = parse_addr)]
    pub picker: SocketAddr,
    /// gatewayd's configuration file: its workers, connect and stream idle timeouts, and
    /// [picker] fallbacks.
    #[arg(long, short = 'c', env = "GATEWAYD_CONFIG")]
    pub config: Option<PathBuf>,
    /// A worker URL (http://IP:PORT or https://IP:PORT), after the file's workers; repeat for
    /// more.
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// Also serve Envoy's admin interface (stats, /ready) on this address; keep it on loopback.
    #[arg(long, value_name = "IP:PORT", value_parser = parse_addr)]
    pub admin: Option<SocketAddr>,
    /// Envoy's files for a picker that speaks TLS.
    #[command(flatten)]
    pub picker_tls: EnvoyPickerTlsArgs,
    /// Envoy's files for https workers, when not at `[upstream.tls]`'s paths.
    #[command(flatten)]
    pub worker_tls: EnvoyWorkerTlsArgs,
}

/// What the bootstrap is made from, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyPlan {
    /// Envoy's client-facing listener.
    pub listen: SocketAddr,
    /// gatewayd's picker.
    pub picker: SocketAddr,
    /// Envoy's admin interface, if any.
    pub admin: Option<SocketAddr>,
    /// The address of every worker of the picker's pool (`[picker] model`'s workers; every
    /// worker without models), in configuration order: Envoy's cluster must hold each endpoint
    /// the picker can name.
    pub workers: Vec<SocketAddr>,
    /// Fallback endpoints per answer, and so Envoy's retries.
    pub fallbacks: usize,
    /// Connect timeout to a worker.
    pub connect_timeout: Duration,
    /// Longest silence on a request's stream.
    pub stream_idle_timeout: Duration,
    /// How long Envoy waits for the picker's answer to one message: a second more than
    /// `[admission] queue_timeout_ms`, since the picker holds the answer while a request waits for
    /// a slot; at least one second.
    pub message_timeout: Duration,
    /// The request and response headers the picker reads (lower case): Envoy sends it only these.
    pub forwarded_headers: Vec<String>,
    /// The `[[discovery]]` names of the picker's pool: workers found there are picked too, but
    /// are not in the generated cluster (a snapshot of the static workers).
    pub discovery: Vec<String>,
    /// Envoy's TLS to the picker; `None` = plain gRPC (a picker without TLS).
    pub picker_tls: Option<PickerTlsPlan>,
    /// Envoy's TLS to the workers; `None` = plain HTTP (no `https://` worker).
    pub worker_tls: Option<WorkerTlsPlan>,
}

impl EnvoyPlan {
    /// The plan for `args`: the configuration (file or defaults) with the flags' workers and the
    /// picker address applied, validated like gatewayd validates it at start (so a worker that is
    /// no `http://IP:PORT` is refused here, by name).
    pub fn from_args(args: &EnvoyConfigArgs) -> anyhow::Result<Self> {
        let mut config = match &args.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        config
            .workers
            .extend(args.workers.iter().map(|url| WorkerConfig::from_url(url)));
        config.picker.listen = Some(args.picker);
        config.validate()?;
        let picker_tls = PickerTlsPlan::from_config(&config, &args.picker_tls)?;
        let members = config.members()?;
        let worker_tls = WorkerTlsPlan::from_config(&config, &members, &args.worker_tls)?;
        // Envoy's cluster holds the workers the picker can name: those of its pool.
        let model = config.picker_model();
        let in_pool = |models: &[String]| model.is_none_or(|m| models.iter().any(|x| x == m));
        let workers = (members.iter())
            .filter(|m| in_pool(&m.spec.models))
            .map(|m| m.url.picker_endpoint().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            listen: args.listen,
            picker: args.picker,
            admin: args.admin,
            workers,
            fallbacks: config.picker.fallbacks,
            connect_timeout: config.server.timeouts.connect,
            stream_idle_timeout: config.server.timeouts.stream_idle,
            message_timeout: message_timeout(&config),
            forwarded_headers: forwarded_headers(&config),
            discovery: (config.discovery.iter())
                .filter(|d| in_pool(&d.models))
                .map(|d| d.dns.clone())
                .collect(),
            picker_tls,
            worker_tls,
        })
    }
}

/// Envoy's ext_proc `message_timeout`: one second, plus the longest a request may wait in the
/// picker's admission queue before its answer.
fn message_timeout(config: &Config) -> Duration {
    Duration::from_secs(1) + Duration::from_millis(config.admission.queue_timeout_ms)
}

/// The headers the picker reads: the routing headers (explicit key, target worker, the implicit
/// keys' `Authorization`, `X-Forwarded-For`, `Cookie`), the declared body size, the response's
/// status, and for its request log line the method, the path and the `x-request-id` Envoy
/// generated or kept (without them every line would say `GET /` with an id of the picker's own,
/// which matches nothing in Envoy's or the worker's logs). Envoy sends only these, so it encodes
/// and the picker decodes a handful of headers per request instead of all of them, and no other
/// header (a credential, a session cookie's neighbours) leaves Envoy.
pub(super) fn forwarded_headers(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let routing = [
        config.routing.routing_key_header.to_ascii_lowercase(),
        config.routing.target_worker_header.to_ascii_lowercase(),
    ];
    let fixed = IMPLICIT_KEY_HEADERS
        .iter()
        .chain(&[
            "content-length",
            ":status",
            ":method",
            ":path",
            REQUEST_ID_HEADER,
        ])
        .map(|h| (*h).to_owned());
    for name in routing.into_iter().chain(fixed) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}
