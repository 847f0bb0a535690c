//! Text utilities the panels share: gateway time of day, the widest of many texts, making gateway
//! text safe to draw, and cutting worker names, routing keys and errors to a width so that the part
//! that tells them apart stays visible. Widths are in characters (every
//! glyph the console draws is one column wide).

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

/// The width in characters of the widest of `texts`, counted no further than `cap`; `None` when
/// there are none. A text no longer in bytes than the widest so far cannot be wider (a character
/// takes at least one byte), so at 10,000 worker names per frame almost none is counted.
pub(super) fn widest<'a>(texts: impl IntoIterator<Item = &'a str>, cap: usize) -> Option<usize> {
    texts.into_iter().fold(None, |widest, text| match widest {
        Some(w) if text.len() <= w || w >= cap => Some(w),
        _ => Some(widest.unwrap_or(0).max(text.chars().take(cap).count())),
    })
}

/// Text the gateway sent (a probe failure, an error) made safe to draw: control characters, which
/// would move the cursor or break the row, become `�`, and whitespace runs one space, so every
/// character takes one cell of the row it is drawn in.
pub(super) fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else if c.is_control() {
            out.push('\u{fffd}');
        } else {
            out.push(c);
        }
    }
    out.trim().to_owned()
}

/// Worker names cut from the left: names derived from URLs (`127.0.0.1:8001`) and fleets of
/// numbered nodes (`gpu-node-17`) differ at the end, so the end is what must stay visible.
pub(super) fn truncate_left(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_owned()
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
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Routing keys cut in the middle: keys of one fleet tend to share a prefix (`chat-session-`) and
/// differ at the end, yet the prefix says what kind of key it is, so both ends stay visible.
pub(super) fn truncate_middle(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_owned();
    }
    let keep = max.saturating_sub(1);
    let head = keep.div_ceil(2);
    let mut t: String = s.chars().take(head).collect();
    t.push('…');
    t.extend(s.chars().skip(n - (keep - head)));
    t
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
    fn printable_drops_what_would_move_the_cursor() {
        assert_eq!(printable("refused"), "refused");
        assert_eq!(printable(" status\n503\t "), "status 503");
        assert_eq!(printable("tls: \u{1b}[2Jbad"), "tls: \u{fffd}[2Jbad");
    }
}
