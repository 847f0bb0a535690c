//! `bch-drill ab`: the policy switched between cells on the gateway, a storm per cell and
//! repetition, and the comparison.

use std::io::Write as _;

use anyhow::Context as _;
use bch_drill::ab::{AbConfig, parse_cells, run_ab, write_plot};
use bch_drill::storm::StormConfig;
use tokio_util::sync::CancellationToken;

use crate::{AbArgs, all_written, note, print_report, write_json};

/// Runs every cell `reps` times, printing each run as it ends, then the report; writes the JSON
/// and the plot if asked. `cancel` fires on Ctrl-C or SIGTERM, and the run puts the policy back.
pub(crate) async fn run(args: AbArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    let cells = parse_cells(&args.cells).context("--cells")?;
    let seed = args.storm.seed();
    let mut storm = StormConfig {
        progress: false,
        tls: args.storm.tls.client_tls()?,
        ..args.storm.config(None, seed)
    };
    args.open_loop.apply(&mut storm)?;
    let config = AbConfig {
        storm,
        seed_given: args.storm.seed.is_some(),
        control: args.control[0].clone(),
        replica_controls: args.control[1..].to_vec(),
        control_token: args.storm.control_token()?,
        cells,
        reps: args.reps,
    };
    let total = config.cells.len() * config.reps;
    note!(
        "bch-drill ab: {total} runs, prompt seed {seed} ({})",
        if config.seed_given {
            "given"
        } else {
            "random; pass --seed to repeat it"
        }
    );
    cancel_on_signal(cancel.clone())?;
    let report = run_ab(&config, &cancel, |run| {
        let cached = if run.report.cached_reported > 0 {
            format!("{:>5.1}%", run.report.cached_token_fraction * 100.0)
        } else {
            "  n/a".to_owned()
        };
        let overload = &run.report.overload;
        // Sheds and goodput only where there is something to say: a storm without them reads
        // as before.
        let mut sheds = String::new();
        if overload.shed + overload.unclean() > 0 {
            sheds = format!("  shed {}  unclean {}", overload.shed, overload.unclean());
        }
        if let Some(goodput) = overload.goodput_rps {
            sheds.push_str(&format!("  goodput {goodput:.1}/s"));
        }
        note!(
            "[{}/{total}] rep {} {:<16} {:>8.1} req/s  TTFT mean {:>7.1} ms  spill {:>5.1}%  cached {cached}{sheds}  seed {}",
            run.order,
            run.rep,
            run.cell,
            run.report.throughput_rps,
            run.report.ttft.mean_ms,
            run.report.spill_fraction * 100.0,
            run.report.shape.seed,
        );
    })
    .await?;
    // Files first, each output tried whatever became of the others: a closed stdout never costs
    // the report file or the chart.
    let written = args.out.as_deref().map(|path| write_json(path, &report));
    let plotted = args.plot.as_deref().map(|path| write_plot(&report, path));
    let printed = print_report(&report);
    all_written(written.into_iter().chain(plotted).chain([printed]))
}

/// Fires `cancel` on Ctrl-C or SIGTERM, so a run in progress can put the gateway's policy back
/// before the process ends.
fn cancel_on_signal(cancel: CancellationToken) -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        note!("bch-drill: interrupted: restoring the gateway's policy");
        cancel.cancel();
    });
    Ok(())
}
