//! Running an A/B comparison: note the gateway's policy and workers, switch the policy to each cell
//! through the control plane, wait for an idle fleet, storm it, in an interleaved order that cancels
//! a linear drift of the machine; then put the policy found back, also after an error or an
//! interruption.

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use bch_core::policy::{PolicyPatch, PolicySettings};
use reqwest::Url;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::cells::Cell;
use super::report::{AbMeta, AbReport, AbRun, WorkerInfo};
use super::summary::summarise;
use crate::control::ControlClient;
use crate::sim::SimConfig;
use crate::storm::{StormConfig, StormShape, run_storm};
use crate::tls::ClientTls;
use crate::worker::SIM_CONFIG_PATH;

/// How long to wait for the fleet to go idle before a run; a run starts anyway, with a warning.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `k` (from 0) use the prompt seed `seed + SEED_STRIDE × (k + 1)`.
const SEED_STRIDE: u64 = 1_000_003;

/// What an A/B run compares and where.
#[derive(Clone, Debug)]
pub struct AbConfig {
    /// The storm of every run; its `seed` is the base of the per-run seeds, and its `control` and
    /// `replica_controls` are replaced by [`AbConfig::control`] and [`AbConfig::replica_controls`].
    pub storm: StormConfig,
    /// True when the base seed was chosen by the user; false when drawn for this invocation. Only
    /// recorded (`meta.seed_given`).
    pub seed_given: bool,
    /// Control-plane URL of the gateway under test.
    pub control: Url,
    /// Control planes of further replicas (the storm's `replicas`): every cell's policy is put in
    /// force on each, and every drain check asks each.
    pub replica_controls: Vec<Url>,
    /// Bearer token for the control plane, when it requires one.
    pub control_token: Option<String>,
    /// Cells; the first is the baseline.
    pub cells: Vec<Cell>,
    /// Repetitions of every cell.
    pub reps: usize,
}

/// The interleaved run order: `(repetition, cell index)` pairs, forward on even repetitions (counting
/// from 0) and reversed on odd ones.
fn run_order(cells: usize, reps: usize) -> Vec<(usize, usize)> {
    (0..reps)
        .flat_map(|rep| {
            (0..cells).map(move |i| (rep, if rep % 2 == 0 { i } else { cells - 1 - i }))
        })
        .collect()
}

/// Now, RFC 3339 in UTC to the second.
fn now_text() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Runs every cell `reps` times in interleaved order, calling `on_run` after each run (for progress
/// output), and summarises. Whatever happens after the first policy switch — the last run, a failed
/// storm, a refused policy, `cancel` firing — the policy the gateway had before is put back (on
/// every replica, each its own); the report says whether that worked (`meta.policy_restored`).
///
/// # Errors
///
/// When there are no cells or no repetitions, a control plane (of any replica) is unreachable
/// (checked before the first storm) or refuses a policy, a storm fails as [`run_storm`] does, or
/// `cancel` fires ("interrupted"); each after the policy was restored, and saying so if it could
/// not be.
pub async fn run_ab(
    config: &AbConfig,
    cancel: &CancellationToken,
    mut on_run: impl FnMut(&AbRun),
) -> anyhow::Result<AbReport> {
    anyhow::ensure!(!config.cells.is_empty(), "no cells to compare");
    anyhow::ensure!(config.reps > 0, "reps must be at least 1");
    config.storm.check()?;
    let urls: Vec<&Url> = std::iter::once(&config.control)
        .chain(&config.replica_controls)
        .collect();
    let controls: Vec<ControlClient> = urls
        .iter()
        .map(|url| ControlClient::new(url, config.control_token.clone(), &config.storm.tls))
        .collect();
    let started_at = now_text();
    // Every replica's policy as found, each put back on its own replica at the end.
    let mut before = Vec::with_capacity(controls.len());
    for control in &controls {
        before.push(policy_in_force(control).await?);
    }
    let workers = describe_workers(&controls[0], &config.storm.tls).await?;
    let outcome = run_cells(config, &controls, cancel, &mut on_run).await;
    let restore_error = restore(&controls, &urls, &before).await;
    let runs = match (outcome, &restore_error) {
        (Ok(runs), _) => runs,
        (Err(e), None) => {
            anyhow::bail!(
                "{e:#} (the gateway's policy was put back as it was before the first run)"
            )
        }
        (Err(e), Some(r)) => {
            anyhow::bail!("{e:#}; and the gateway's policy was NOT put back: {r}")
        }
    };
    let meta = AbMeta {
        tool: format!("bch-drill {}", env!("CARGO_PKG_VERSION")),
        started_at,
        finished_at: now_text(),
        seed: config.storm.seed,
        seed_given: config.seed_given,
        gateway: joined(config.storm.gateways()),
        control: joined(urls.iter().copied()),
        storm: StormShape::of(&config.storm),
        policy_before: before.swap_remove(0).0,
        policy_restored: restore_error.is_none(),
        restore_error,
        workers,
    };
    Ok(summarise(&config.cells, config.reps, runs, meta))
}

/// URLs, comma-separated (one per replica).
fn joined<'a>(urls: impl Iterator<Item = &'a Url>) -> String {
    urls.map(Url::as_str).collect::<Vec<_>>().join(",")
}

/// `GET /admin/policy`, as answered and as settings to put back. Also fails on an unreachable
/// control plane before the first storm, not after it.
async fn policy_in_force(control: &ControlClient) -> anyhow::Result<(Value, PolicySettings)> {
    let answer = control.policy().await?;
    let settings = serde_json::from_value(answer.clone())
        .context("GET /admin/policy answered an unexpected shape")?;
    Ok((answer, settings))
}

/// Puts every replica's policy back as `before` found it; `None` when all were, else why not
/// (naming each control plane that failed).
async fn restore(
    controls: &[ControlClient],
    urls: &[&Url],
    before: &[(Value, PolicySettings)],
) -> Option<String> {
    let mut errors = Vec::new();
    for ((control, url), (answer, settings)) in controls.iter().zip(urls).zip(before) {
        if let Err(e) = control
            .put_policy(&restoring_body(answer, settings))
            .await
            .with_context(|| format!("restoring the policy found before the first run on {url}"))
        {
            errors.push(format!("{e:#}"));
        }
    }
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// The body that puts back the policy `settings` read from `answer`, with the admission settings
/// the answer reported, if any (a gateway without admission reports none, and is sent none).
fn restoring_body(answer: &Value, settings: &PolicySettings) -> Value {
    let mut body =
        serde_json::to_value(PolicyPatch::from(*settings)).expect("a policy patch serialises");
    if let Some(admission) = answer.get("admission").filter(|a| a.is_object()) {
        body["admission"] = admission.clone();
    }
    body
}

/// Every run in order, stopping at the first error or when `cancel` fires.
async fn run_cells(
    config: &AbConfig,
    controls: &[ControlClient],
    cancel: &CancellationToken,
    on_run: &mut impl FnMut(&AbRun),
) -> anyhow::Result<Vec<AbRun>> {
    let mut runs = Vec::new();
    for (order, (rep, cell_index)) in run_order(config.cells.len(), config.reps)
        .into_iter()
        .enumerate()
    {
        let cell = &config.cells[cell_index];
        let run = tokio::select! {
            run = run_one(config, controls, cell, rep, order) => run?,
            () = cancel.cancelled() => anyhow::bail!(
                "interrupted during run {} of {} (cell {}, repetition {})",
                order + 1,
                config.cells.len() * config.reps,
                cell.label,
                rep + 1
            ),
        };
        on_run(&run);
        runs.push(run);
    }
    Ok(runs)
}

/// The gateway's workers, each with its simulator settings when it is a simulated worker.
async fn describe_workers(
    control: &ControlClient,
    tls: &ClientTls,
) -> anyhow::Result<Vec<WorkerInfo>> {
    let http = tls
        .http_client()
        .timeout(Duration::from_secs(2))
        .build()
        .context("building the HTTP client")?;
    let mut workers = Vec::new();
    for w in control.workers().await? {
        let sim = sim_config(&http, &w.url).await;
        workers.push(WorkerInfo {
            name: w.name,
            url: w.url,
            sim,
        });
    }
    Ok(workers)
}

/// `GET {url}/bch-sim/config`, or `None` when the worker is not a simulated one.
async fn sim_config(http: &reqwest::Client, url: &str) -> Option<SimConfig> {
    let url = format!("{}{SIM_CONFIG_PATH}", url.trim_end_matches('/'));
    let response = http.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body: Value = response.json().await.ok()?;
    serde_json::from_value(body.get("config")?.clone()).ok()
}

/// Repetition `rep` of `cell`, `order`-th in the run order (both from 0).
async fn run_one(
    config: &AbConfig,
    controls: &[ControlClient],
    cell: &Cell,
    rep: usize,
    order: usize,
) -> anyhow::Result<AbRun> {
    let mut policy = serde_json::Value::Null;
    for control in controls {
        policy = control
            .put_policy(&cell.body())
            .await
            .with_context(|| format!("switching the policy to cell {}", cell.label))?;
    }
    // Start from an idle fleet, whatever the previous run left in flight.
    let idle = ControlClient::wait_all_drained(controls, IDLE_TIMEOUT).await;
    if !idle.all_zero {
        tracing::warn!(cell = %cell.label, active = ?idle.active, "starting a run on a fleet that is not idle");
    }
    let storm = StormConfig {
        control: Some(config.control.clone()),
        replica_controls: config.replica_controls.clone(),
        control_token: config.control_token.clone(),
        // A seed per run: every run starts with prompts no worker has cached.
        seed: config
            .storm
            .seed
            .wrapping_add(SEED_STRIDE.wrapping_mul(order as u64 + 1)),
        ..config.storm.clone()
    };
    let report = run_storm(&storm)
        .await
        .with_context(|| format!("storm of cell {} in repetition {}", cell.label, rep + 1))?;
    Ok(AbRun {
        rep: rep + 1,
        cell: cell.label.clone(),
        order: order + 1,
        policy,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetitions_alternate_direction() {
        assert_eq!(
            run_order(3, 3),
            vec![
                (0, 0),
                (0, 1),
                (0, 2),
                (1, 2),
                (1, 1),
                (1, 0),
                (2, 0),
                (2, 1),
                (2, 2)
            ]
        );
        // Over a pair of repetitions every cell has the same mean position.
        let order = run_order(4, 2);
        for cell in 0..4 {
            let positions: usize = order
                .iter()
                .enumerate()
                .filter(|(_, (_, c))| *c == cell)
                .map(|(p, _)| p)
                .sum();
            assert_eq!(positions, 7);
        }
    }
}
