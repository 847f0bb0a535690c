//! A replay's two header lines: the status (`▶ REPLAY`, the recorded time, the speed, how far in)
//! in place of the connection's, and the timeline in place of the key hints, with the drill's
//! spill and error moments marked and the position on it, and the number of warnings after it
//! (the line the live console sums them up on), so 80×24 shows that something is wrong.

use ratatui::text::{Line, Span};

use super::pool_label;
use super::styles::{Styles, Tone};
use super::text::clock;
use super::warnings::count_span;
use crate::state::{Playback, State, Warning};

/// A stretch of the timeline with nothing in it.
const EMPTY: char = '─';
/// A stretch in which a frame carried spills.
const SPILL: char = 's';
/// A stretch with an error moment (a refused command, an unreadable frame, a lost connection);
/// it wins over a spill in the same cell.
const ERROR: char = '!';
/// Where the replay stands.
const POSITION: char = '●';

/// `bch ▶ REPLAY 12:34:56.789 ×1  01:23 of 05:00  recorded by gatewayd  (RESYNCING, PAUSED)`;
/// a rotated recording played as one says `3 files by gatewayd` instead, shorter, so the count
/// survives at 80 columns.
pub(super) fn status_line(state: &State, playback: &Playback, styles: &Styles) -> Line<'static> {
    let (mark, tone) = if playback.paused {
        ("⏸", Tone::Warning)
    } else {
        ("▶", Tone::Good)
    };
    let mut spans = vec![Span::styled(" bch ", styles.brand()), Span::raw(" ")];
    spans.extend(pool_label::spans(state, styles));
    spans.extend([
        Span::styled(
            format!("{mark} REPLAY {}", clock(playback.position_ms)),
            styles.status(tone),
        ),
        Span::styled(format!(" ×{}", speed_text(playback.speed)), styles.dim()),
        Span::raw(format!(
            "  {} of {}",
            span_text(playback.position_ms.saturating_sub(playback.start_ms)),
            span_text(playback.end_ms.saturating_sub(playback.start_ms)),
        )),
    ]);
    let recorded_by = if playback.files > 1 {
        format!("  {} files by {}", playback.files, playback.recorder)
    } else {
        format!("  recorded by {}", playback.recorder)
    };
    spans.push(Span::styled(recorded_by, styles.dim()));
    if state.resyncing() {
        spans.push(Span::styled("  RESYNCING", styles.status(Tone::Warning)));
    }
    if state.paused() {
        spans.push(Span::styled(
            format!("  FROZEN at {}", clock(state.visible().ts_ms)),
            styles.paused(),
        ));
    }
    Line::from(spans)
}

/// The timeline across `width` cells: each cell a equal stretch of the recording, marked with
/// its worst moment, and the position drawn over it; then ` ! 2 damaged lines` when the
/// recording held lines it could not read, and ` ✗ 3 warnings (w)` when `warnings` has any, the
/// timeline giving up the room.
pub(super) fn timeline_line(
    playback: &Playback,
    warnings: &[Warning],
    width: u16,
    styles: &Styles,
) -> Line<'static> {
    let damaged = (playback.damaged > 0).then(|| {
        let plural = if playback.damaged == 1 { "" } else { "s" };
        Span::styled(
            format!(" {ERROR} {} damaged line{plural}", playback.damaged),
            styles.tone(Tone::Alert),
        )
    });
    let count = count_span(warnings, styles);
    let count_w = [&damaged, &count]
        .iter()
        .map(|span| span.as_ref().map_or(0, |c| c.width() as u16))
        .sum::<u16>();
    let cells = usize::from(width.saturating_sub(2 + count_w)).max(1);
    let span = playback.end_ms.saturating_sub(playback.start_ms).max(1);
    let cell_of = |ms: u64| -> usize {
        let offset = ms.saturating_sub(playback.start_ms).min(span);
        ((u128::from(offset) * cells as u128 / u128::from(span + 1)) as usize).min(cells - 1)
    };
    let mut line = vec![EMPTY; cells];
    for &at in playback.spills.iter() {
        line[cell_of(at)] = SPILL;
    }
    for &at in playback.errors.iter() {
        line[cell_of(at)] = ERROR;
    }
    let position = cell_of(playback.position_ms);
    let mut spans = vec![Span::raw(" ")];
    for (index, cell) in line.into_iter().enumerate() {
        let (symbol, style) = match cell {
            _ if index == position => (POSITION, styles.status(Tone::Good)),
            SPILL => (SPILL, styles.tone(Tone::Warning)),
            ERROR => (ERROR, styles.tone(Tone::Alert)),
            other => (other, styles.dim()),
        };
        spans.push(Span::styled(symbol.to_string(), style));
    }
    spans.extend(damaged);
    spans.extend(count);
    Line::from(spans)
}

/// `0.25`, `1`, `16`: the speed without trailing zeros.
fn speed_text(speed: f64) -> String {
    let text = format!("{speed:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `mm:ss` (or `h:mm:ss` past an hour) of a span in milliseconds.
fn span_text(ms: u64) -> String {
    let secs = ms / 1000;
    match secs / 3600 {
        0 => format!("{:02}:{:02}", secs / 60, secs % 60),
        hours => format!("{hours}:{:02}:{:02}", (secs / 60) % 60, secs % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn playback(position_ms: u64) -> Playback {
        Playback {
            position_ms,
            start_ms: 1_000,
            end_ms: 11_000,
            speed: 0.25,
            paused: false,
            recorder: "bch-tui".into(),
            files: 1,
            damaged: 0,
            spills: vec![3_000, 3_100].into(),
            errors: vec![8_000].into(),
        }
    }

    fn text(line: &Line<'_>) -> String {
        line.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn the_timeline_marks_spills_errors_and_the_position() {
        let styles = Styles::default();
        // 10 cells of one second each (12 columns less the margins).
        assert_eq!(
            text(&timeline_line(&playback(1_000), &[], 12, &styles)),
            " ●ss───!───"
        );
        assert_eq!(
            text(&timeline_line(&playback(11_000), &[], 12, &styles)),
            " ─ss───!──●"
        );
        let damaged = Playback {
            damaged: 2,
            ..playback(1_000)
        };
        assert_eq!(
            text(&timeline_line(&damaged, &[], 30, &styles)),
            " ●ss───!─── ! 2 damaged lines"
        );
        assert_eq!(speed_text(0.25), "0.25");
        assert_eq!(speed_text(16.0), "16");
        assert_eq!(span_text(83_000), "01:23");
        assert_eq!(span_text(3_723_000), "1:02:03");
    }

    #[test]
    fn a_rotated_recording_counts_its_files() {
        let styles = Styles::default();
        let state = State::for_replicas(vec!["ws://gw/ws".into()]);
        let one = text(&status_line(&state, &playback(1_000), &styles));
        assert!(one.ends_with("recorded by bch-tui"), "{one}");
        let three = Playback {
            files: 3,
            ..playback(1_000)
        };
        let three = text(&status_line(&state, &three, &styles));
        assert!(
            three.ends_with("00:00 of 00:10  3 files by bch-tui"),
            "{three}"
        );
    }
}
