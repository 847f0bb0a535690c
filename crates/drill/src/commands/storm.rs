//! `bch-drill storm`: one storm at a gateway, and its report.

use std::io::Write as _;

use anyhow::Context as _;
use bch_drill::storm::{run_storm_until, write_records};
use tokio_util::sync::CancellationToken;

use crate::{StormArgs, all_written, note, print_report, write_json};

/// Fires one storm (open-loop with `--rate`), writes the report as JSON and the per-request
/// records if asked, and prints it. The file comes first and
/// each output is tried whatever became of the other, so a closed stdout never costs the file
/// and a file that cannot be written never costs the printed report. Ctrl-C or SIGTERM (`cancel`)
/// stops the storm: the report of the requests started is still written and printed, and the
/// command then fails with "interrupted".
pub(crate) async fn run(args: StormArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    args.storm.control_token()?;
    let seed = args.storm.seed();
    let mut config = args.storm.config(args.control.first().cloned(), seed);
    config.replica_controls = args.control.iter().skip(1).cloned().collect();
    config.eject_refused_replicas = args.eject_refused_replicas;
    config.tls = args.storm.tls.client_tls()?;
    args.open_loop.apply(&mut config)?;
    cancel_on_signal(cancel.clone())?;
    let report = run_storm_until(&config, &cancel).await?;
    let written = args.out.as_deref().map(|path| write_json(path, &report));
    let recorded = args
        .records
        .as_deref()
        .map(|path| write_records(path, &report.records));
    let printed = print_report(&report);
    let interrupted = report.interrupted.then(|| {
        Err(anyhow::anyhow!(
            "interrupted: the report covers the {} requests started",
            report.requests
        ))
    });
    all_written(
        written
            .into_iter()
            .chain(recorded)
            .chain([printed])
            .chain(interrupted),
    )
}

/// Fires `cancel` at the first Ctrl-C or SIGTERM, so the storm stops and its report is still
/// written; a second one ends the process at once (a drain check that hangs is no trap).
pub(crate) fn cancel_on_signal(cancel: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        note!(
            "bch-drill: interrupted: abandoning the requests in flight; the report follows (again to quit at once)"
        );
        cancel.cancel();
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        note!("bch-drill: interrupted twice: quitting without the report");
        std::process::exit(130);
    });
    Ok(())
}
