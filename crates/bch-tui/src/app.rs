//! The event loop that ties the pieces together: key presses and telemetry in, state transitions,
//! commands out, and redraws paced to a frame budget.
//!
//! Input never waits on the network: the connection runs in its own task (`conn`) and both sides
//! only exchange channel messages. Drawing happens only when something changed, at most
//! once per [`FRAME_BUDGET`], plus on a [`TICK`] while something time-based is showing (the
//! reconnect countdown, the age of the last frame) — so a storm of ticks does not turn into a
//! storm of redraws. The tick also fails threshold changes that got no answer in time.

use std::time::Duration;

use anyhow::Context;
use bch_core::telemetry::ClientCommand;
use crossterm::event::{Event, KeyEvent};
use futures_util::{Stream, StreamExt};
use ratatui::Terminal;
use ratatui::backend::Backend;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::conn::{ConnEvent, ConnStatus};
use crate::input::{Action, map_key};
use crate::recorder::Recorder;
use crate::state::{Effect, ReplicaId, State};
use crate::view;

/// Minimum time between two redraws (25 fps).
pub const FRAME_BUDGET: Duration = Duration::from_millis(40);
/// Redraw tick while something time-based (the reconnect countdown) is on screen.
const TICK: Duration = Duration::from_millis(250);

/// The state plus the ways out to the network tasks, one per replica.
#[derive(Debug)]
pub struct App {
    state: State,
    commands: Vec<mpsc::UnboundedSender<ClientCommand>>,
    /// `--record`: where every connection event goes before it is applied.
    recorder: Option<Recorder>,
}

impl App {
    /// An app watching the replicas of `state`: `commands[i]` is the inbox of the network task of
    /// `ReplicaId(i)`. A
    /// threshold change goes to every replica; a `resync` only to the one that missed frames.
    pub fn with_replicas(
        state: State,
        commands: Vec<mpsc::UnboundedSender<ClientCommand>>,
    ) -> Self {
        Self {
            state,
            commands,
            recorder: None,
        }
    }

    /// Records every connection event from now on into `recorder` (`--record`).
    pub fn record_to(&mut self, recorder: Recorder) {
        self.recorder = Some(recorder);
    }

    /// Everything the console knows, for reading; it changes only through the `handle_*` methods.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Handles one key press; returns `true` when the operator asked to quit.
    fn handle_key(&mut self, key: &KeyEvent) -> bool {
        match map_key(self.state.mode(), key) {
            Some(action) => self.handle_action(action),
            None => false,
        }
    }

    /// Carries out an action; returns `true` when it was quit.
    pub fn handle_action(&mut self, action: Action) -> bool {
        match self.state.apply_action(action) {
            Effect::None => false,
            Effect::Send(cmd) => {
                for commands in &self.commands {
                    // A network task only goes away with the app; see `send`.
                    let _ = commands.send(cmd.clone());
                }
                false
            }
            Effect::Quit => true,
        }
    }

    /// Applies an event from replica `replica`'s network task, answering a seq gap with `resync`
    /// to that replica.
    pub fn handle_replica_conn(&mut self, replica: ReplicaId, event: ConnEvent) {
        if let Some(recorder) = &mut self.recorder
            && let Err(error) = recorder.record(replica, &event)
        {
            // The console goes on; the operator learns that the file is incomplete from here.
            self.recorder = None;
            self.state.set_notice(format!("recording stopped: {error}"));
        }
        if matches!(event, ConnEvent::Frame(_)) {
            self.state.frame_received_on(replica, Instant::now());
        }
        if let Some(cmd) = self.state.apply_replica_event(replica, event) {
            self.send(replica, cmd);
        }
    }

    fn send(&mut self, replica: ReplicaId, cmd: ClientCommand) {
        // The network task only goes away when the app does; if it did, the command simply
        // stays pending and the header shows that nothing came back.
        if let Some(commands) = self.commands.get(replica.0) {
            let _ = commands.send(cmd);
        }
    }
}

/// Where the loop gets connection events from: every replica's network task, each event tagged
/// with its [`ReplicaId`].
pub trait ConnEvents {
    /// The next event and its replica, `None` once every sender is gone.
    fn recv(&mut self) -> impl std::future::Future<Output = Option<(ReplicaId, ConnEvent)>>;
    /// An event already queued, without waiting.
    fn try_recv(&mut self) -> Option<(ReplicaId, ConnEvent)>;
}

impl ConnEvents for mpsc::UnboundedReceiver<(ReplicaId, ConnEvent)> {
    async fn recv(&mut self) -> Option<(ReplicaId, ConnEvent)> {
        mpsc::UnboundedReceiver::recv(self).await
    }
    fn try_recv(&mut self) -> Option<(ReplicaId, ConnEvent)> {
        mpsc::UnboundedReceiver::try_recv(self).ok()
    }
}

/// Runs the console until quit: reads terminal events from `input`, telemetry from `conn_events`,
/// and draws on `terminal`. Generic over the backend, the input stream and the event source so
/// tests can drive it with a `TestBackend` and scripted keys.
pub async fn run<B, I, E>(
    terminal: &mut Terminal<B>,
    mut input: I,
    app: &mut App,
    mut conn_events: E,
) -> anyhow::Result<()>
where
    E: ConnEvents,
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
    I: Stream<Item = std::io::Result<Event>> + Unpin,
{
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut dirty = true;
    let mut last_draw: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let due = last_draw.map_or(now, |t| t + FRAME_BUDGET);
        if dirty && now >= due {
            draw(terminal, app, now)?;
            dirty = false;
            last_draw = Some(now);
        }
        let redraw_at = dirty.then_some(due);
        tokio::select! {
            // Keys first: a quit must not queue behind a burst of telemetry.
            biased;
            event = input.next() => match on_terminal_event(app, event)? {
                After::Quit => return Ok(()),
                After::Redraw => dirty = true,
                After::Nothing => {}
            },
            event = conn_events.recv() => {
                let (replica, event) = event.context("the connection task stopped")?;
                app.handle_replica_conn(replica, event);
                // Apply everything already queued before the next draw, so a backlog is caught up
                // in one frame instead of one frame per message.
                while let Some((replica, event)) = conn_events.try_recv() {
                    app.handle_replica_conn(replica, event);
                }
                dirty = true;
            }
            _ = tick.tick() => {
                // The countdown, the age of the last frame (and the stale mark when frames stop)
                // and command timeouts change with time alone.
                let expired = app.state.expire_commands(Instant::now());
                if expired || app.state.counting_down() || *app.state.conn() == ConnStatus::Connected {
                    dirty = true;
                }
            }
            _ = tokio::time::sleep_until(redraw_at.unwrap_or(now)), if redraw_at.is_some() => {}
        }
    }
}

/// What the loop does after a terminal event.
enum After {
    Quit,
    Redraw,
    Nothing,
}

/// Handles one item of the terminal's event stream; the end of the stream quits, like `q`.
fn on_terminal_event(
    app: &mut App,
    event: Option<std::io::Result<Event>>,
) -> anyhow::Result<After> {
    Ok(match event {
        Some(Ok(Event::Key(key))) => {
            if app.handle_key(&key) {
                After::Quit
            } else {
                After::Redraw
            }
        }
        Some(Ok(Event::Resize(..))) => After::Redraw,
        Some(Ok(_)) => After::Nothing,
        Some(Err(e)) => return Err(e).context("reading the terminal"),
        None => After::Quit,
    })
}

/// Draws one frame at `now`, first telling the state how many rows each panel gets at this size.
fn draw<B>(terminal: &mut Terminal<B>, app: &mut App, now: Instant) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let size = terminal.size().context("reading the terminal size")?;
    let viewports = view::viewports(size.into(), &app.state);
    app.state.set_viewports(viewports);
    terminal
        .draw(|frame| view::draw(frame, &app.state, now))
        .context("drawing the console")?;
    Ok(())
}
