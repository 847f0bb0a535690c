//! Running an A/B comparison: switch the gateway's policy to each cell through the control plane,
//! wait for an idle fleet, storm it, in an interleaved order that cancels a linear drift of the
//! machine.

use std::time::Duration;

use anyhow::Context as _;
use reqwest::Url;

use super::cells::Cell;
use super::report::{AbReport, AbRun, summarise};
use crate::control::ControlClient;
use crate::storm::{StormConfig, run_storm};

/// How long to wait for the fleet to go idle before a run; a run starts anyway, with a warning.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// What an A/B run compares and where.
#[derive(Clone, Debug)]
pub struct AbConfig {
    /// The storm of every run; its `seed` is the base of the per-run seeds, and its `control` is
    /// replaced by [`AbConfig::control`].
    pub storm: StormConfig,
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

/// Runs every cell `reps` times in interleaved order, calling `on_run` after each run (for progress
/// output), and summarises.
///
/// # Errors
///
/// When there are no cells or no repetitions, the control plane is unreachable (checked before the
/// first storm) or refuses a policy, or a storm fails as [`run_storm`] does.
pub async fn run_ab(config: &AbConfig, mut on_run: impl FnMut(&AbRun)) -> anyhow::Result<AbReport> {
    anyhow::ensure!(!config.cells.is_empty(), "no cells to compare");
    anyhow::ensure!(config.reps > 0, "reps must be at least 1");
    let controls: Vec<ControlClient> = std::iter::once(&config.control)
        .chain(&config.replica_controls)
        .map(|url| ControlClient::new(url, config.control_token.clone()))
        .collect();
    // Fail on an unreachable control plane before the first storm, not after it.
    for control in &controls {
        control.workers().await?;
    }
    let mut runs = Vec::new();
    for (order, (rep, cell_index)) in run_order(config.cells.len(), config.reps)
        .into_iter()
        .enumerate()
    {
        let run = run_one(config, &controls, &config.cells[cell_index], rep, order).await?;
        on_run(&run);
        runs.push(run);
    }
    Ok(summarise(&config.cells, config.reps, runs))
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
            .set_policy(&cell.policy)
            .await
            .with_context(|| format!("switching the policy to cell {}", cell.label))?;
    }
    // Start from an idle fleet, whatever the previous run left in flight.
    let idle = ControlClient::wait_all_drained(controls, IDLE_TIMEOUT).await?;
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
            .wrapping_add(1_000_003 * (order as u64 + 1)),
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
