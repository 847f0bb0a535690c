//! `gatewayd --demo`: embedded simulated workers plus a gentle background storm.

use std::path::PathBuf;

use crate::config::{Config, WorkerConfig};

/// Runs the demo until interrupted.
pub async fn run(
    _config: Config,
    _config_path: Option<PathBuf>,
    _cli_workers: Vec<WorkerConfig>,
    _workers: usize,
) -> anyhow::Result<()> {
    anyhow::bail!("the demo is not available yet")
}
