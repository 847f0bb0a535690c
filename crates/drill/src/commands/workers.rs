//! `bch-drill workers`: simulated workers on consecutive ports until Ctrl-C or SIGTERM, over
//! https with `--tls-cert` and `--tls-key` (and client certificates required with `--client-ca`).

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use bch_drill::worker::{server_tls_config, spawn_https_worker, spawn_worker};

use crate::{WorkersArgs, note};

/// Starts the simulated workers and runs them until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: WorkersArgs) -> anyhow::Result<()> {
    let config = args.sim.config()?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(server_tls_config(cert, key, args.client_ca.as_deref())?),
        _ => None,
    };
    let mut handles = Vec::with_capacity(args.count);
    for i in 0..args.count {
        let port = if args.base_port == 0 {
            0
        } else {
            u16::try_from(usize::from(args.base_port) + i).context("port out of range")?
        };
        let (addr, name) = ((args.host, port).into(), format!("sim-{i}"));
        let handle = match &tls {
            Some(tls) => spawn_https_worker(addr, name, config.clone(), Arc::clone(tls)).await?,
            None => spawn_worker(addr, name, config.clone()).await?,
        };
        // The list is for whoever started the workers; one that can no longer be written (stdout a
        // pipe whose reader is gone) must not stop workers that others are sending requests to.
        if let Err(e) = writeln!(std::io::stdout(), "{} {}", handle.name(), handle.url()) {
            note!(
                "bch-drill: could not write {} to standard output: {e}",
                handle.name()
            );
        }
        handles.push(handle);
    }
    note!(
        "{} simulated worker(s) running (time scale {}); Ctrl-C or SIGTERM stops them",
        handles.len(),
        config.time_scale
    );
    // SIGTERM too: scripts and `kill %1` stop background workers that way, and they should wind
    // down as gracefully as after Ctrl-C.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    note!("stopping: letting in-flight responses finish");
    for handle in handles {
        handle.shutdown().await?;
    }
    Ok(())
}
