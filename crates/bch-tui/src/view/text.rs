//! Text utilities the panels share: gateway time of day, the widest of many texts, making gateway
//! text safe to draw, cutting worker names, routing keys and errors to a width so that the part
//! that tells them apart stays visible, and wrapping sentences to a width. Widths are in characters (every
//! glyph the console draws is one column wide).

use std::borrow::Cow;

use unicode_width::UnicodeWidthChar;

/// The layout makes room for keys up to this long (the key table and the spill log side by side
/// or stacked); longer keys are cut in the middle wherever they do not fit.
pub(super) const MAX_WANTED_KEY_W: u16 = 48;

/// `HH:MM:SS.mmm` (UTC) of a Unix-epoch millisecond timestamp. Gateway time, not local time: the
/// spill log must agree with the gateway's own logs.
pub(super) fn clock(ts_ms: u64) -> String {
    let ms = ts_ms % 1000;
    let secs = ts_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{ms:03}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

/// The width in columns of the widest of `texts` once [`printable`], counted no further than
/// `cap`; `None` when there are none. A text no longer in bytes than the widest so far cannot be
/// wider (a character takes at least one byte, and [`printable`] never widens), so at 10,000
/// worker names per frame almost none is counted.
pub(super) fn widest<'a>(texts: impl IntoIterator<Item = &'a str>, cap: usize) -> Option<usize> {
    texts.into_iter().fold(None, |widest, text| match widest {
        Some(w) if text.len() <= w || w >= cap => Some(w),
        _ => Some(
            widest
                .unwrap_or(0)
                .max(printable(text).chars().take(cap).count()),
        ),
    })
}

/// Text that came over the network (a worker name, a routing key, a probe or discovery error, a
/// gateway's message) made safe to draw; every panel draws such text only through this, or
/// through the `truncate_*` functions and [`shown_width`], which apply it first. Whitespace runs
/// (tabs, newlines, the line and paragraph separators U+2028/U+2029) become one space and the
/// ends are trimmed; C0 and C1 controls, bidi embeddings, overrides and isolates (U+202A–202E,
/// U+2066–2069, the marks U+200E/U+200F/U+061C), zero-width characters and every other character
/// that does not take exactly one cell (combining marks, wide glyphs) become `�`. So a key
/// cannot move the cursor, reorder or hide the rest of its row, and every character of the
/// result takes one cell: widths counted in characters after it are columns.
pub(crate) fn printable(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && !s.starts_with(' ')
        && !s.ends_with(' ')
        && !s.contains("  ")
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_whitespace() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
        } else if one_cell(c) {
            out.push(c);
        } else {
            out.push('\u{fffd}');
        }
    }
    let kept = out.trim_end().len();
    out.truncate(kept);
    Cow::Owned(out)
}

/// Whether `c` draws as one cell and changes nothing around it.
fn one_cell(c: char) -> bool {
    let invisible = matches!(
        c,
        '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{feff}'
    );
    !c.is_control() && !invisible && UnicodeWidthChar::width(c) == Some(1)
}

/// Columns `s` takes once made [`printable`]: how panels measure network text.
pub(super) fn shown_width(s: &str) -> usize {
    printable(s).chars().count()
}

/// Worker names cut from the left: names derived from URLs (`127.0.0.1:8001`) and fleets of
/// numbered nodes (`gpu-node-17`) differ at the end, so the end is what must stay visible.
pub(super) fn truncate_left(s: &str, max: usize) -> String {
    let s = printable(s);
    let n = s.chars().count();
    if n <= max {
        s.into_owned()
    } else {
        let keep = max.saturating_sub(1);
        let mut t = String::from("…");
        t.extend(s.chars().skip(n - keep));
        t
    }
}

/// Error texts cut at the right with `…`: an error says its kind first (`tls: certificate not
/// trusted`, `no answer within 2s`), its detail after.
pub(super) fn truncate_right(s: &str, max: usize) -> String {
    let s = printable(s);
    if s.chars().count() <= max {
        return s.into_owned();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Routing keys cut in the middle: keys of one fleet tend to share a prefix (`chat-session-`) and
/// differ at the end, yet the prefix says what kind of key it is, so both ends stay visible.
pub(super) fn truncate_middle(s: &str, max: usize) -> String {
    let s = printable(s);
    let n = s.chars().count();
    if n <= max {
        return s.into_owned();
    }
    let keep = max.saturating_sub(1);
    let head = keep.div_ceil(2);
    let mut t: String = s.chars().take(head).collect();
    t.push('…');
    t.extend(s.chars().skip(n - (keep - head)));
    t
}

/// `s` made [`printable`] and broken into lines of at most `width` columns, at spaces where it
/// can and inside a word longer than a line where it must; the spaces a break falls on are
/// dropped. Always at least one line.
pub(super) fn wrap(s: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut line_w = 0;
    for word in printable(s).split(' ').filter(|w| !w.is_empty()) {
        let mut word: Vec<char> = word.chars().collect();
        if line_w > 0 && line_w + 1 + word.len() <= width {
            line.push(' ');
            line.extend(&word);
            line_w += 1 + word.len();
            continue;
        }
        if line_w > 0 {
            lines.push(std::mem::take(&mut line));
        }
        while word.len() > width {
            lines.push(word.drain(..width).collect());
        }
        line_w = word.len();
        line = word.into_iter().collect();
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_utc_time_of_day() {
        assert_eq!(clock(1_700_000_000_123), "22:13:20.123");
        assert_eq!(clock(0), "00:00:00.000");
    }

    #[test]
    fn truncate_marks_cut_labels() {
        assert_eq!(truncate_middle("chat-session-0001", 9), "chat…0001");
        assert_eq!(truncate_middle("abcdef", 4), "ab…f");
        assert_eq!(truncate_middle("abc", 4), "abc");
        assert_eq!(truncate_left("127.0.0.1:18101", 8), "…1:18101");
        assert_eq!(truncate_left("w0", 8), "w0");
        assert_eq!(truncate_right("tls: certificate", 8), "tls: ce…");
        assert_eq!(truncate_right("refused", 8), "refused");
    }

    #[test]
    fn wrap_breaks_at_spaces_and_inside_overlong_words() {
        assert_eq!(wrap("a scrape is stale", 8), ["a scrape", "is stale"]);
        assert_eq!(wrap("abcdefghij xy", 4), ["abcd", "efgh", "ij", "xy"]);
        assert_eq!(wrap("", 4), [""]);
        assert_eq!(wrap("one\ntwo", 20), ["one two"]);
    }

    #[test]
    fn printable_drops_what_would_move_the_cursor() {
        assert_eq!(printable("refused"), "refused");
        assert_eq!(printable(" status\n503\t "), "status 503");
        assert_eq!(printable("tls: \u{1b}[2Jbad"), "tls: \u{fffd}[2Jbad");
        assert_eq!(
            printable("a\u{202e}b\u{2066}c\u{2028}d\u{200b}e\u{9b}f\u{feff}g"),
            "a\u{fffd}b\u{fffd}c d\u{fffd}e\u{fffd}f\u{fffd}g"
        );
        assert!(matches!(printable("w0 10.0.0.1:8000"), Cow::Borrowed(_)));
        assert_eq!(shown_width("chat\u{200b}"), 5);
        assert_eq!(truncate_middle("ab\u{202e}cdef", 4), "ab…f");
    }
}
