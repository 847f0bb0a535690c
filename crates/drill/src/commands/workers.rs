//! `bch-drill workers`: simulated workers on consecutive ports until Ctrl-C or SIGTERM.

use anyhow::Context as _;
use bch_drill::worker::spawn_worker;

use crate::WorkersArgs;

/// Starts the simulated workers and runs them until Ctrl-C or SIGTERM.
pub(crate) async fn run(args: WorkersArgs) -> anyhow::Result<()> {
    let config = args.sim.config()?;
    let mut handles = Vec::with_capacity(args.count);
    for i in 0..args.count {
        let port = if args.base_port == 0 {
            0
        } else {
            u16::try_from(usize::from(args.base_port) + i).context("port out of range")?
        };
        let handle =
            spawn_worker((args.host, port).into(), format!("sim-{i}"), config.clone()).await?;
        println!("{} {}", handle.name(), handle.url());
        handles.push(handle);
    }
    eprintln!(
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
    eprintln!("stopping: letting in-flight responses finish");
    for handle in handles {
        handle.shutdown().await?;
    }
    Ok(())
}
