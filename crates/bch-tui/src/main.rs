//! `bch-tui`: the bch operator console. See `docs/tui.md`.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use bch_tui::{
    App, Cli, ConnConfig, ConnHandle, Recorder, Replay, ReplicaId, State, TerminalGuard,
    run_replay, screen_text,
};
use clap::Parser;
use crossterm::event::EventStream;

// One thread is plenty: the work is parsing a few frames a second and drawing at most 25 fps, and
// a single thread keeps an idle console nearly free.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(signal)) => {
            // Shells report a death by signal N as 128 + N; a clean exit on the signal says the
            // same. Written, not `eprintln!`: after a hangup stderr is the dead terminal, and
            // `eprintln!` panics when its write fails.
            let _ = writeln!(std::io::stderr(), "bch-tui: stopped by {}", signal.name());
            ExitCode::from(128 + signal.number())
        }
        Err(e) => {
            // `error: …` with its causes on one line, like gatewayd; no backtrace even with
            // RUST_BACKTRACE=1 (these are operator mistakes, not bugs). A failed write is lost:
            // the terminal may be what failed.
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the console; `Some(signal)` when a signal ended it.
async fn run(cli: Cli) -> anyhow::Result<Option<StopSignal>> {
    // A replay connects to nothing: the URLs (perhaps from the environment) are not checked.
    if let Some(path) = &cli.replay {
        return replay(&cli, path).await;
    }
    cli.validate()?;
    let token = cli.token()?;
    // Built once, shared by every wss:// replica (ws:// ones ignore it).
    let tls = cli.tls()?;

    // One network task per replica; their events reach the loop tagged with the replica's id.
    let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
    let mut commands = Vec::new();
    let mut tasks = Vec::new();
    for (index, url) in cli.url.iter().enumerate() {
        let mut config = ConnConfig::new(url.clone());
        config.token = token.clone();
        config.tls = Some(tls.clone());
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
    let mut state = State::for_replicas(cli.url.clone());
    state.set_drain_warning(std::time::Duration::from_secs(
        cli.drain_warning.saturating_mul(60),
    ));
    if cli.read_only {
        state.set_read_only();
    }
    state.set_pool(cli.model.clone());
    let mut app = App::with_replicas(state, commands);
    if let Some(path) = &cli.record {
        let recorder = Recorder::create(path, cli.url.clone())
            .with_context(|| format!("--record {}", path.display()))?;
        app.record_to(recorder);
    }
    if let Some(after) = cli.snapshot {
        snapshot_live(&cli, &mut app, events, after).await;
        for task in tasks {
            task.abort();
        }
        return Ok(None);
    }
    // Before the terminal is set up, so no moment of raw mode is without them.
    let mut stop = StopSignals::install().context("cannot handle signals")?;

    let mut guard = TerminalGuard::enter()
        .context("cannot set up the terminal (bch-tui needs an interactive terminal)")?;
    let mut result = tokio::select! {
        result = bch_tui::run(guard.terminal(), EventStream::new(), &mut app, events) => {
            result.map(|()| None)
        }
        signal = stop.recv() => Ok(Some(signal)),
    };
    if result.is_err() {
        // A terminal that hangs up fails the next draw and sends SIGHUP in the same kernel call;
        // which of the two the loop sees first is chance. The signal's handler has run by the
        // time the failed write returns, so one short turn of the reactor finds it, and the exit
        // says "hangup" (129) every time rather than an I/O error now and then.
        if let Ok(signal) = tokio::time::timeout(SIGNAL_AFTER_FAILURE, stop.recv()).await {
            result = Ok(Some(signal));
        }
    }
    // Restore before printing any error, so it lands on the normal screen. On a terminal that
    // hung up the restoring writes fail, and are ignored.
    drop(guard);
    for task in tasks {
        task.abort();
    }
    result
}

/// `--snapshot` of live gateways: watches for `after`, then prints one screen and returns.
async fn snapshot_live(
    cli: &Cli,
    app: &mut App,
    mut events: tokio::sync::mpsc::UnboundedReceiver<(ReplicaId, bch_tui::ConnEvent)>,
    after: std::time::Duration,
) {
    let deadline = tokio::time::Instant::now() + after;
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some((replica, event)) => app.handle_replica_conn(replica, event),
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    let mut state = app.state().clone();
    print_screen(&screen_text(
        &mut state,
        cli.width,
        cli.height,
        tokio::time::Instant::now(),
    ));
}

/// `--replay`: the recording played in the console, or with `--snapshot` one screen at that
/// recorded time printed.
async fn replay(cli: &Cli, path: &std::path::Path) -> anyhow::Result<Option<StopSignal>> {
    let mut replay = Replay::open(path)?;
    if let Some(left_out) = replay.left_out() {
        // Before the screen takes the terminal, so it stays in the scrollback too.
        eprintln!("bch-tui: --replay {}: {left_out}", path.display());
    }
    replay.state_mut().set_pool(cli.model.clone());
    if let Some(after) = cli.snapshot {
        let at = replay.start_ms().saturating_add(after.as_millis() as u64);
        replay.seek(at);
        let now = replay.instant_of(replay.position_ms());
        let playback = replay.playback();
        let state = replay.state_mut();
        state.set_playback(Some(playback));
        print_screen(&screen_text(state, cli.width, cli.height, now));
        return Ok(None);
    }
    let mut stop = StopSignals::install().context("cannot handle signals")?;
    let mut guard = TerminalGuard::enter()
        .context("cannot set up the terminal (bch-tui needs an interactive terminal)")?;
    let result = tokio::select! {
        result = run_replay(guard.terminal(), EventStream::new(), &mut replay) => result.map(|()| None),
        signal = stop.recv() => Ok(Some(signal)),
    };
    drop(guard);
    result
}

/// Writes a `--snapshot` screen to stdout; a reader that went away is not an error worth a panic.
fn print_screen(screen: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(screen.as_bytes());
    let _ = out.flush();
}

/// How long a failed console waits for a stop signal that explains the failure (a hangup).
const SIGNAL_AFTER_FAILURE: std::time::Duration = std::time::Duration::from_millis(100);

/// A signal that ends the console.
#[derive(Debug, Clone, Copy)]
enum StopSignal {
    /// The terminal hung up: its window closed, the SSH session dropped, the pane was killed.
    Hangup,
    /// A polite stop (`kill`, a service manager).
    Terminate,
    /// `kill -INT` (in raw mode Ctrl-C is a key press, not a signal).
    Interrupt,
}

impl StopSignal {
    fn name(self) -> &'static str {
        match self {
            StopSignal::Hangup => "SIGHUP",
            StopSignal::Terminate => "SIGTERM",
            StopSignal::Interrupt => "SIGINT",
        }
    }

    fn number(self) -> u8 {
        match self {
            StopSignal::Hangup => 1,
            StopSignal::Interrupt => 2,
            StopSignal::Terminate => 15,
        }
    }
}

/// The handlers for [`StopSignal`]s. Without them the default action kills the process on the
/// spot: the terminal is left in raw mode on the alternate screen (after `kill`), and with SIGHUP
/// ignored (`nohup`) crossterm's reader spins on the hung-up terminal's failing reads.
struct StopSignals {
    hangup: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            hangup: signal(SignalKind::hangup())?,
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// The next stop signal.
    async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            _ = self.hangup.recv() => StopSignal::Hangup,
            _ = self.terminate.recv() => StopSignal::Terminate,
            _ = self.interrupt.recv() => StopSignal::Interrupt,
        }
    }
}
