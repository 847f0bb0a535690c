//! `gatewayd explain`: the offline what-if. The scenario (workers, loads, health, thresholds, a
//! key) goes through the same decision function as live routing (docs/explain.md).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::ExitCode;

use bch_core::explain::{Explainer, Scenario};
use bch_core::fleet_load::LoadSource;
use bch_core::policy::{PolicyKind, SpillOrder};
use clap::Args;

use crate::app::terminal::{StdoutClosed, print_err, print_out};

use super::value_parsers::{
    parse_load, parse_load_source, parse_policy, parse_serves, parse_spill_order,
};

/// `gatewayd explain` options.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Read one JSON scenario per line on stdin and write one `{"worker","branch"}` per line.
    #[arg(long, conflicts_with_all = [
        "workers", "routing_key", "reported", "local_at_scrape", "max_in_flight_per_worker",
        "max_in_flight", "engine_full", "serves", "model",
    ])]
    pub batch: bool,
    /// A worker URL, in configuration order; repeat for every worker.
    #[arg(long = "worker", value_name = "URL", required_unless_present = "batch")]
    pub workers: Vec<String>,
    /// In-flight requests on a worker before the request, as `URL=N`; repeat. Unlisted workers
    /// have 0.
    #[arg(long = "load", value_name = "URL=N", value_parser = parse_load)]
    pub loads: Vec<(String, u64)>,
    /// A worker (by URL) that is unhealthy and so cannot be chosen; repeat for more.
    #[arg(long = "unhealthy", value_name = "URL")]
    pub unhealthy: Vec<String>,
    /// The routing key to place.
    #[arg(long, required_unless_present = "batch")]
    pub routing_key: Option<String>,
    /// Treat the key as implicit (Authorization-like): never spills.
    #[arg(long)]
    pub implicit: bool,
    /// In-flight requests the preferred worker may exceed the fleet minimum by before the key can
    /// spill.
    #[arg(long, default_value_t = bch_core::policy::DEFAULT_MIN_LOAD_GAP)]
    pub min_load_gap: u64,
    /// Factor over the fleet mean load the preferred worker must exceed before the key can spill
    /// (finite, at least 1.0).
    #[arg(long, default_value_t = bch_core::policy::DEFAULT_MAX_LOAD_SKEW)]
    pub max_load_skew: f64,
    /// Where a spilled request goes among the workers under the bound: ring (the next one
    /// clockwise) or hash_seeded (a per-key pseudo-random order of the workers).
    #[arg(long, value_parser = parse_spill_order, default_value = "ring")]
    pub spill_order: SpillOrder,
    /// The routing policy to decide with; explain studies the bounded policy unless told otherwise.
    #[arg(long, value_parser = parse_policy, default_value = "bounded_consistent_hashing")]
    pub policy: PolicyKind,
    /// Which load the rule reads: local (the --load values) or worker_metrics (the --reported
    /// values, corrected by this replica's requests since the scrape).
    #[arg(long, value_parser = parse_load_source, default_value = "local")]
    pub load_source: LoadSource,
    /// A worker's reported running + waiting requests at its last scrape, as `URL=N`; repeat.
    /// Workers without one fall back to their --load value in worker_metrics mode.
    #[arg(long = "reported", value_name = "URL=N", value_parser = parse_load)]
    pub reported: Vec<(String, u64)>,
    /// This replica's in-flight requests on a worker when its scrape was sent, as `URL=N`;
    /// repeat. Defaults to the worker's --load value (nothing changed since the scrape).
    #[arg(long = "local-at-scrape", value_name = "URL=N", value_parser = parse_load)]
    pub local_at_scrape: Vec<(String, u64)>,
    /// Requests in flight each worker may hold (`[admission] max_in_flight_per_worker`): a worker
    /// whose load the rule reads is at or above it is full. 0 (the default) is no cap.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_in_flight_per_worker: u64,
    /// One worker's own cap, as `URL=N` (0 = no cap for it); repeat. Overrides
    /// --max-in-flight-per-worker for that worker.
    #[arg(long = "max-in-flight", value_name = "URL=N", value_parser = parse_load)]
    pub max_in_flight: Vec<(String, u64)>,
    /// A worker (by URL) whose engine reports saturation (over `max_waiting` or `max_kv_usage`),
    /// so it is full whatever its load; repeat for more.
    #[arg(long = "engine-full", value_name = "URL")]
    pub engine_full: Vec<String>,
    /// A model a worker serves, as `URL=MODEL`; repeat (also for a worker's second model). With
    /// any, --model is required and the decision is taken in that model's pool.
    #[arg(long = "serves", value_name = "URL=MODEL", value_parser = parse_serves)]
    pub serves: Vec<(String, String)>,
    /// The request's model: decide among the workers that serve it (see --serves).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
}

/// Runs `gatewayd explain`: one scenario from the flags, or `--batch` scenarios from stdin.
pub fn explain(args: ExplainArgs) -> ExitCode {
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
        spill_order: args.spill_order,
        policy: args.policy,
        load_source: args.load_source,
        reported: args.reported.into_iter().collect(),
        local_at_scrape: args.local_at_scrape.into_iter().collect(),
        max_in_flight_per_worker: args.max_in_flight_per_worker,
        max_in_flight: args.max_in_flight.into_iter().collect(),
        engine_full: args.engine_full.into_iter().map(|u| (u, true)).collect(),
        models: args
            .serves
            .into_iter()
            .fold(HashMap::new(), |mut models, (url, model)| {
                models.entry(url).or_insert_with(Vec::new).push(model);
                models
            }),
        model: args.model,
    };
    match explainer.explain(&scenario) {
        Ok(answer) => {
            let text = serde_json::to_string_pretty(&answer).expect("answers serialise");
            match print_out(format_args!("{text}\n")) {
                Ok(()) => ExitCode::SUCCESS,
                Err(closed) => closed.exit(),
            }
        }
        Err(e) => {
            print_err(format_args!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// One `--batch` answer line: `{"worker","branch"}`, and `wait` when the request would wait for
/// room (absent otherwise, so lines of scenarios without full workers are as they always were).
#[derive(serde::Serialize)]
struct BatchAnswer {
    worker: Option<String>,
    branch: bch_core::policy::Branch,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait: Option<bch_core::explain::WaitsFor>,
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
                    wait: a.wait,
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
        if let Err(error) = written
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
        {
            return StdoutClosed::from(error).exit();
        }
    }
    if let Err(error) = out.flush() {
        return StdoutClosed::from(error).exit();
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
