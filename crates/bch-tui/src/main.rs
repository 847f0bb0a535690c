//! `bch-tui`: the bch operator console. See `docs/tui.md`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context;
use bch_tui::{App, Cli, ConnConfig, ConnHandle, ReplicaId, State, TerminalGuard};
use clap::Parser;
use crossterm::event::EventStream;

// One thread is plenty: the work is parsing a few frames a second and drawing at most 25 fps, and
// a single thread keeps an idle console nearly free.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `error: …` with its causes on one line, like gatewayd; no backtrace even with
            // RUST_BACKTRACE=1 (these are operator mistakes, not bugs).
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    cli.validate()?;
    let token = cli.token()?;

    // One network task per replica; their events reach the loop tagged with the replica's id.
    let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
    let mut commands = Vec::new();
    let mut tasks = Vec::new();
    for (index, url) in cli.url.iter().enumerate() {
        let mut config = ConnConfig::new(url.clone());
        config.token = token.clone();
        let mut handle = ConnHandle::spawn(config);
        commands.push(handle.commands);
        let forward = events_tx.clone();
        tasks.push(handle.task);
        tasks.push(tokio::spawn(async move {
            while let Some(event) = handle.events.recv().await {
                if forward.send((ReplicaId(index), event)).is_err() {
                    return;
                }
            }
        }));
    }
    drop(events_tx);
    let mut app = App::with_replicas(State::for_replicas(cli.url.clone()), commands);

    let mut guard = TerminalGuard::enter()
        .context("cannot set up the terminal (bch-tui needs an interactive terminal)")?;
    let result = bch_tui::run(guard.terminal(), EventStream::new(), &mut app, events).await;
    // Restore before printing any error, so it lands on the normal screen.
    drop(guard);
    for task in tasks {
        task.abort();
    }
    result
}
