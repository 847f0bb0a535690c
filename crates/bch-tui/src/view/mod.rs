//! Drawing. Everything here reads `&State` and the time passed in, and writes only to the frame:
//! rendering cannot change state, and the same state at the same `now` draws the same screen (the
//! snapshot tests rely on it).
//!
//! This file owns the layout and [`draw`]; each panel has its own file (`header`, `workers`,
//! `ring`, `keys`, `spills`, `help`, `warnings`, `history`), drawn in the common frame of `panel`, with every colour from
//! `styles` and the text cutting of `text`; `discovery` warns on the workers panel's border and
//! `fleet_summary` sums up the whole fleet for the workers panel; `pool_label` names the pool
//! shown, for the header.
//!
//! Distinctions that matter to an operator (healthy or not, over the bound or not, spilled or not,
//! focused panel) are carried by glyphs and words as well as colour, so they survive a monochrome
//! terminal, a screen reader and a text snapshot.

mod discovery;
mod fleet_summary;
mod header;
mod help;
mod history;
mod keys;
mod panel;
mod pool_label;
mod replicas;
mod ring;
mod spills;
mod styles;
mod text;
mod timeline;
mod warnings;
mod workers;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use tokio::time::Instant;

use self::styles::Styles;
use crate::state::State;

/// Widths at or above this get workers and ring beside each other at the 60/40 split, and the key
/// table beside the spill log when both fit whole (see [`bottom_layout`]).
const WIDE: u16 = 120;
/// The header's rows: status, policy, sparklines, message.
const HEADER_ROWS: u16 = 4;

/// Where each part of the screen goes.
#[derive(Debug, Clone, Copy)]
struct Areas {
    header: Rect,
    /// The replica rows; zero height with one replica.
    replicas: Rect,
    workers: Rect,
    ring: Rect,
    keys: Rect,
    spills: Rect,
}

/// Splits `area` for what `state` shows: two columns on top from [`WIDE`] on, one below it; the
/// replica rows under the header when there are several.
fn layout(area: Rect, state: &State) -> Areas {
    let [header, replicas, body] = Layout::vertical([
        Constraint::Length(HEADER_ROWS),
        Constraint::Length(replicas::height(state.replicas().len())),
        Constraint::Min(0),
    ])
    .areas(area);
    let mut areas = if area.width >= WIDE {
        wide_layout(header, body, state)
    } else {
        narrow_layout(header, body)
    };
    areas.replicas = replicas;
    areas
}

/// Workers and ring side by side on top, sized to the fleet up to nearly half the height; keys and
/// spills below, as [`bottom_layout`] places them.
fn wide_layout(header: Rect, body: Rect, state: &State) -> Areas {
    let worker_rows = (state.visible().workers.len() as u16).saturating_add(3);
    let top_h = worker_rows.clamp(7, (body.height * 9 / 20).max(7));
    let [top, bottom] =
        Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(body);
    let [workers, ring] =
        Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(top);
    let (keys, spills) = bottom_layout(bottom, state);
    Areas {
        header,
        replicas: Rect::default(),
        workers,
        ring,
        keys,
        spills,
    }
}

/// Keys beside spills when `bottom` is wide enough for both to show their keys and worker names
/// whole (each gets what it needs and half the room left); else keys above spills at full width,
/// the keys getting the rows their tracked keys need, leaving the spill log the rows it needs or
/// half the height, whichever is less. Half of 120 columns gives IP:PORT names and tenant keys
/// no room, so the choice is made from the content, not from the terminal's width alone.
fn bottom_layout(bottom: Rect, state: &State) -> (Rect, Rect) {
    let keys_w = keys::wanted_width(state);
    let spills_w = spills::wanted_width(state);
    if keys_w + spills_w <= bottom.width {
        let slack = bottom.width - keys_w - spills_w;
        let [keys, spills] =
            Layout::horizontal([Constraint::Length(keys_w + slack / 2), Constraint::Min(0)])
                .areas(bottom);
        return (keys, spills);
    }
    let h = bottom.height;
    let spills_h = spills::wanted_height(state);
    let keys_h = keys::wanted_height(state).min((h / 2).max(h.saturating_sub(spills_h)));
    let [keys, spills] =
        Layout::vertical([Constraint::Length(keys_h), Constraint::Min(0)]).areas(bottom);
    (keys, spills)
}

/// Workers and ring side by side on top, then keys, then spills, in bands of about a third.
fn narrow_layout(header: Rect, body: Rect) -> Areas {
    let [top, keys, spills] = Layout::vertical([
        Constraint::Percentage(36),
        Constraint::Percentage(36),
        Constraint::Min(0),
    ])
    .areas(body);
    let [workers, ring] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(top);
    Areas {
        header,
        replicas: Rect::default(),
        workers,
        ring,
        keys,
        spills,
    }
}

/// Content rows each panel shows on a terminal of `area`, indexed like `Panel::ALL`: the app hands
/// them to the state so scrolling stops where the view does (no dead key presses past the end).
pub fn viewports(area: Rect, state: &State) -> [usize; 4] {
    let a = layout(area, state);
    // Borders take two rows; workers, ring and keys also spend one on a legend, strip or header.
    let rows = |r: Rect, extra: u16| r.height.saturating_sub(2 + extra) as usize;
    [
        workers::content_rows(state.visible().workers.len(), a.workers.height),
        rows(a.ring, 1),
        rows(a.keys, 1),
        rows(a.spills, 0),
    ]
}

/// Draws the whole console for `state`, with time-based text (the reconnect countdown) taken at
/// `now`.
pub fn draw(frame: &mut Frame, state: &State, now: Instant) {
    let styles = Styles::default();
    let area = frame.area();
    let a = layout(area, state);
    header::draw(frame, a.header, state, now, &styles);
    if a.replicas.height > 0 {
        replicas::draw(frame, a.replicas, state, now, &styles);
    }
    workers::draw(frame, a.workers, state, &styles);
    discovery::draw(frame, a.workers, state, &styles);
    ring::draw(frame, a.ring, state, &styles);
    keys::draw(frame, a.keys, state, &styles);
    spills::draw(frame, a.spills, state, &styles);
    if state.ui().warnings_open() {
        // Over the key table and the spill log: the fleet's own panels stay in view.
        warnings::draw(frame, a.keys.union(a.spills), &state.warnings(now), &styles);
    }
    // Over the same place, above the warnings: the pane the operator opened last with a key.
    history::draw(frame, a.keys.union(a.spills), state, &styles);
    if state.ui().help_open() {
        help::draw(frame, area, state.playback().is_some(), &styles);
    }
}
