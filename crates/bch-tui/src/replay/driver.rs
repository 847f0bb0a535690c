//! The replay's interactive loop: the recorded clock runs at the chosen speed against the wall
//! clock; keys pause, seek and change speed; every other key does what it does live, except the
//! ones that would change a gateway, which say why they do nothing.

use std::time::Duration;

use anyhow::Context;
use crossterm::event::{Event, KeyEvent};
use futures_util::{Stream, StreamExt};
use ratatui::Terminal;
use ratatui::backend::Backend;
use tokio::time::Instant;

use super::engine::Replay;
use crate::input::{Mode, ReplayKey, map_key, map_replay_key};
use crate::state::{Effect, State};
use crate::view;

/// How far ← and → seek, recorded time.
const SEEK_STEP_MS: u64 = 10_000;
/// Minimum time between two redraws (25 fps), as live.
const FRAME_BUDGET: Duration = Duration::from_millis(40);
/// Redraw at least this often while playing, so the clock moves between sparse events.
const TICK: Duration = Duration::from_millis(250);
/// What a key that would change a gateway says in a replay.
const READ_ONLY: &str = "replay: threshold and drain keys do nothing here (this is a recording, \
                         not a gateway)";

/// The recorded clock: recorded time `recorded_ms` at wall instant `wall`, running at the
/// replay's speed from there.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    wall: Instant,
    recorded_ms: u64,
}

impl Anchor {
    fn now(replay: &Replay) -> Self {
        Self {
            wall: Instant::now(),
            recorded_ms: replay.position_ms(),
        }
    }

    /// The recorded time at wall instant `now`.
    fn recorded_at(&self, now: Instant, speed: f64) -> u64 {
        let elapsed = now.saturating_duration_since(self.wall).as_secs_f64();
        self.recorded_ms + (elapsed * speed * 1000.0) as u64
    }

    /// The wall instant at which recorded time `at_ms` comes.
    fn wall_at(&self, at_ms: u64, speed: f64) -> Instant {
        let ahead = at_ms.saturating_sub(self.recorded_ms) as f64 / 1000.0 / speed;
        self.wall + Duration::from_secs_f64(ahead.min(3600.0))
    }
}

/// Carries out a replay key; the recorded clock is re-anchored by the caller.
fn on_replay_key(replay: &mut Replay, key: ReplayKey) {
    let here = replay.position_ms();
    match key {
        ReplayKey::TogglePlay => replay.set_paused(!replay.paused()),
        ReplayKey::Seek(forward) => replay.seek(if forward {
            here.saturating_add(SEEK_STEP_MS)
        } else {
            here.saturating_sub(SEEK_STEP_MS)
        }),
        ReplayKey::Spill(forward) => match replay.spill_from_here(forward) {
            Some(at) => replay.seek(at),
            None => replay
                .state_mut()
                .set_notice("replay: no spill that way".to_owned()),
        },
        ReplayKey::Edge(false) => replay.seek(replay.start_ms()),
        ReplayKey::Edge(true) => replay.seek(replay.end_ms()),
        ReplayKey::Speed(faster) => replay.change_speed(faster),
    }
}

/// Handles one key: `true` when the operator asked to quit.
fn on_key(replay: &mut Replay, key: &KeyEvent) -> bool {
    let mode = replay.state().mode();
    if mode == Mode::Normal
        && let Some(replay_key) = map_replay_key(key)
    {
        on_replay_key(replay, replay_key);
        return false;
    }
    match map_key(mode, key) {
        Some(action) if action.writes() => {
            replay.state_mut().set_notice(READ_ONLY.to_owned());
            false
        }
        Some(action) => matches!(replay.state_mut().apply_action(action), Effect::Quit),
        None => false,
    }
}

/// Plays `replay` on `terminal` until quit, reading keys from `input`.
///
/// # Errors
///
/// The terminal failed (drawing, reading keys).
pub async fn run_replay<B, I>(
    terminal: &mut Terminal<B>,
    mut input: I,
    replay: &mut Replay,
) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
    I: Stream<Item = std::io::Result<Event>> + Unpin,
{
    replay.advance_to(replay.start_ms());
    let mut anchor = Anchor::now(replay);
    loop {
        let now = Instant::now();
        if !replay.paused() {
            replay.advance_to(anchor.recorded_at(now, replay.speed()));
            if replay.next_at_ms().is_none() {
                // The end: stop there, so the last screen stays until the operator seeks.
                replay.set_paused(true);
            }
        }
        draw(terminal, replay)?;
        let wake = match replay.next_at_ms() {
            Some(next) if !replay.paused() => anchor.wall_at(next, replay.speed()).min(now + TICK),
            _ => now + TICK,
        }
        .max(now + FRAME_BUDGET);
        tokio::select! {
            biased;
            event = input.next() => match event {
                Some(Ok(Event::Key(key))) => {
                    if on_key(replay, &key) {
                        return Ok(());
                    }
                    anchor = Anchor::now(replay);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => return Ok(()),
            },
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Draws the replay's state, telling it where the replay stands and how tall the panels are.
fn draw<B>(terminal: &mut Terminal<B>, replay: &mut Replay) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let playback = replay.playback();
    let now = replay.instant_of(replay.position_ms());
    let state: &mut State = replay.state_mut();
    state.set_playback(Some(playback));
    let size = terminal.size().context("reading the terminal size")?;
    state.set_viewports(view::viewports(size.into(), state));
    terminal
        .draw(|frame| view::draw(frame, state, now))
        .context("drawing the console")?;
    Ok(())
}
