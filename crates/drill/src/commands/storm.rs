//! `bch-drill storm`: one storm at a gateway, and its report.

use bch_drill::storm::run_storm;

use crate::{StormArgs, all_written, print_report, write_json};

/// Fires one storm, writes the report as JSON if asked, and prints it. The file comes first and
/// each output is tried whatever became of the other, so a closed stdout never costs the file
/// and a file that cannot be written never costs the printed report.
pub(crate) async fn run(args: StormArgs) -> anyhow::Result<()> {
    args.storm.control_token()?;
    let seed = args.storm.seed();
    let mut config = args.storm.config(args.control.first().cloned(), seed);
    config.replica_controls = args.control.iter().skip(1).cloned().collect();
    config.eject_refused_replicas = args.eject_refused_replicas;
    let report = run_storm(&config).await?;
    let written = args.out.as_deref().map(|path| write_json(path, &report));
    let printed = print_report(&report);
    all_written(written.into_iter().chain([printed]))
}
