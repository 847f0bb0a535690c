//! `bch-drill storm`: one storm at a gateway, and its report.

use bch_drill::storm::run_storm;

use crate::{StormArgs, write_json};

/// Fires one storm, prints the report and writes it as JSON if asked.
pub(crate) async fn run(args: StormArgs) -> anyhow::Result<()> {
    args.storm.control_token()?;
    let seed = args.storm.seed();
    let mut config = args.storm.config(args.control.first().cloned(), seed);
    config.replica_controls = args.control.iter().skip(1).cloned().collect();
    let report = run_storm(&config).await?;
    print!("{report}");
    if let Some(path) = &args.out {
        write_json(path, &report)?;
    }
    Ok(())
}
