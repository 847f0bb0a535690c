//! `gatewayd`: the bch gateway daemon. See `gatewayd --help` and docs/.
#![forbid(unsafe_code)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = gatewayd::cli::Cli::parse();
    gatewayd::cli::run(cli)
}
