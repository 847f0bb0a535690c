//! A request id's lineage: SGLang's `rid` names a conversation's turns and their retries with
//! suffixes, so the session a request belongs to is the id without them. Apart from the scanner
//! because it is a rule about id names, not about JSON.

/// The session a request id belongs to: `rid` without its lineage suffixes, `_tN` (turn N) and
/// `_rN` (retry N), stripped from the end in any number and order (`conv9_t5_r1` → `conv9`), so
/// a conversation's turns and their retries share one routing key. A suffix is `_t` or `_r`
/// followed by one or more ASCII digits; an id that is nothing but suffixes is kept whole.
pub fn rid_lineage_root(rid: &str) -> &str {
    let mut root = rid;
    while let Some(shorter) = without_lineage_suffix(root) {
        if shorter.is_empty() {
            return root;
        }
        root = shorter;
    }
    root
}

/// `text` without one trailing `_tN` or `_rN`, when it ends with one.
fn without_lineage_suffix(text: &str) -> Option<&str> {
    let digits = text.len() - text.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let head = &text[..text.len() - digits];
    head.strip_suffix("_t").or_else(|| head.strip_suffix("_r"))
}
