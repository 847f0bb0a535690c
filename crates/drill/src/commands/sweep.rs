//! `bch-drill sweep`: open-loop storms at rising rates, one line per step as it ends, then the
//! capacity estimate and the knee.

use std::io::Write as _;

use bch_drill::storm::{SATURATED_SHARE, SweepReport, SweepStep, run_sweep};
use tokio_util::sync::CancellationToken;

use super::storm::cancel_on_signal;
use crate::rate::SweepArgs;
use crate::{all_written, note, write_json};

/// Runs the sweep, printing each step on stdout as it ends (with a note on stderr before each, so
/// a long run shows progress), then the estimate; writes the JSON if asked. Ctrl-C stops it with
/// the steps run so far.
pub(crate) async fn run(args: SweepArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    let seed = args.storm.seed();
    let config = args.config(seed)?;
    let per_step = config
        .storm
        .open_loop
        .map(|o| o.duration)
        .unwrap_or_default();
    note!(
        "bch-drill sweep: up to {} steps of {:.0} s from {:.1} req/s, prompt seed {seed}",
        config.max_steps,
        per_step.as_secs_f64(),
        config.start_rate
    );
    cancel_on_signal(cancel.clone())?;
    let mut index = 0;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", header());
    let report = run_sweep(&config, &cancel, |step| {
        index += 1;
        let _ = writeln!(out, "{}", line(step));
        let _ = out.flush();
        note!(
            "bch-drill sweep: step {index} of at most {} done",
            config.max_steps
        );
    })
    .await?;
    let written = args.out.as_deref().map(|path| write_json(path, &report));
    let printed = writeln!(std::io::stdout(), "{}", summary(&report)).map_err(Into::into);
    all_written(written.into_iter().chain([printed]))
}

fn header() -> String {
    format!(
        "{:>10} {:>10} {:>10} {:>12} {:>8} {:>8} {:>8} {:>9}",
        "asked/s", "achieved/s", "goodput/s", "p99 TTFT ms", "200", "shed", "other", "in flight"
    )
}

/// One step: rates, goodput, p99 TTFT, answers, sheds, unclean, peak in flight; `SATURATED`
/// when goodput is below 90% of the rate achieved.
fn line(step: &SweepStep) -> String {
    format!(
        "{:>10.1} {:>10.1} {:>10.1} {:>12.1} {:>8} {:>8} {:>8} {:>9}{}",
        step.rate_asked,
        step.rate_achieved,
        step.goodput_rps,
        step.ttft_p99_ms,
        step.answered,
        step.shed,
        step.unclean,
        step.peak_in_flight,
        if step.saturated { "  SATURATED" } else { "" }
    )
}

fn summary(report: &SweepReport) -> String {
    let knee = report.knee_rps.map_or_else(
        || "none: the first step was already saturated".to_owned(),
        |k| format!("{k:.1} req/s"),
    );
    format!(
        "capacity {:.1} req/s (best goodput)   knee {knee} (last rate with goodput >= {:.0}% of it)   stopped: {}",
        report.capacity_rps,
        SATURATED_SHARE * 100.0,
        report.stopped
    )
}
