//! Routing key extraction from request headers (docs/policy.md, "Routing keys"), and the names of
//! the headers bch adds to responses.
//!
//! Precedence, first match wins:
//! 1. target worker header (`X-SMG-Target-Worker`): a worker's name, else its exact URL, else a
//!    decimal 0-based index in configuration order; strict, load ignored, a miss is a 503;
//! 2. explicit key header (`X-SMG-Routing-Key`): used when it is in the key grammar
//!    ([`ExplicitKey::parse`]: non-empty, valid UTF-8, at most [`MAX_EXPLICIT_KEY_BYTES`] bytes, no
//!    control character, no space at either end), otherwise ignored as if absent (and reported so
//!    it can be counted); the only kind of key that may spill;
//! 3. implicit key: the first non-empty of `Authorization`, `X-Forwarded-For`, `Cookie`; strict;
//! 4. no key.
//!
//! Implicit values are credentials. [`ImplicitKey`] keeps only the value's ring position and which
//! header it came from, so no `Debug`, `Display` or serde path can print the value: there is nothing
//! left to print. Its label is `implicit:` plus 8 hex digits of the hash.

use std::fmt;

use crate::ring::hash_position;

/// Longest explicit routing key accepted, in bytes (SGLang Model Gateway's limit).
pub const MAX_EXPLICIT_KEY_BYTES: usize = 128;
/// Explicit keys are shown in telemetry truncated to this many characters.
pub const MAX_KEY_LABEL_CHARS: usize = 64;
/// Default explicit routing key header (SGLang Model Gateway's name).
pub const DEFAULT_ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
/// Default target worker header (SGLang Model Gateway's name).
pub const DEFAULT_TARGET_WORKER_HEADER: &str = "x-smg-target-worker";
/// Response header naming the worker that served the request (its configured name).
pub const WORKER_HEADER: &str = "x-bch-worker";
/// Response header naming the routing branch the request took ([`crate::policy::Branch::as_str`]).
pub const BRANCH_HEADER: &str = "x-bch-branch";
/// Headers that give an implicit key, in precedence order (lower case).
pub const IMPLICIT_KEY_HEADERS: [&str; 3] = ["authorization", "x-forwarded-for", "cookie"];

/// Header names used for routing. Names are matched case-insensitively by the caller's header
/// lookup; store them in lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingHeaders {
    /// Explicit key header name.
    pub routing_key: String,
    /// Target worker header name.
    pub target_worker: String,
}

impl Default for RoutingHeaders {
    fn default() -> Self {
        Self {
            routing_key: DEFAULT_ROUTING_KEY_HEADER.to_owned(),
            target_worker: DEFAULT_TARGET_WORKER_HEADER.to_owned(),
        }
    }
}

/// The key a request is routed by, borrowed from the request's headers (no allocation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RoutingKey<'a> {
    /// Pin to one worker by name, URL or index (raw header bytes; resolved against the worker list).
    Target(&'a [u8]),
    /// Explicit routing key.
    Explicit(ExplicitKey<'a>),
    /// Implicit key from a credential-bearing header.
    Implicit(ImplicitKey),
    /// No key at all.
    None,
}

impl fmt::Debug for RoutingKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoutingKey::Target(raw) => {
                write!(f, "Target({:?})", String::from_utf8_lossy(raw))
            }
            RoutingKey::Explicit(key) => write!(f, "Explicit({:?})", key.as_str()),
            RoutingKey::Implicit(key) => write!(f, "Implicit({key:?})"),
            RoutingKey::None => f.write_str("None"),
        }
    }
}

impl RoutingKey<'_> {
    /// Ring position of the key, for the two kinds of key that are hashed.
    pub fn position(&self) -> Option<u64> {
        match self {
            RoutingKey::Explicit(key) => Some(key.position()),
            RoutingKey::Implicit(key) => Some(key.position()),
            RoutingKey::Target(_) | RoutingKey::None => None,
        }
    }
}

/// A valid explicit routing key: non-empty, UTF-8, at most [`MAX_EXPLICIT_KEY_BYTES`] bytes, no
/// control character (Unicode `Cc`: C0 including tab, DEL, C1) and no space at either end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ExplicitKey<'a> {
    key: &'a str,
    position: u64,
}

impl<'a> ExplicitKey<'a> {
    /// Validates `raw` as an explicit key: the one key grammar of every front end (the data
    /// plane, the endpoint picker, `/admin/explain`). An HTTP parser never hands over a header
    /// value with a control character or a space at either end, but the picker's peer sends
    /// header values as raw bytes, so the grammar says it rather than the parser: a key that
    /// routes must also be one a client could send and telemetry can show as it is.
    pub fn parse(raw: &'a [u8]) -> Result<Self, IgnoredKey> {
        if raw.is_empty() {
            return Err(IgnoredKey::Empty);
        }
        if raw.len() > MAX_EXPLICIT_KEY_BYTES {
            return Err(IgnoredKey::TooLong);
        }
        let key = std::str::from_utf8(raw).map_err(|_| IgnoredKey::NotUtf8)?;
        if key.chars().any(char::is_control) {
            return Err(IgnoredKey::ControlCharacter);
        }
        if key.starts_with(' ') || key.ends_with(' ') {
            return Err(IgnoredKey::SurroundingSpace);
        }
        Ok(Self {
            key,
            position: hash_position(raw),
        })
    }

    /// The key text.
    pub fn as_str(&self) -> &'a str {
        self.key
    }

    /// Ring position (BLAKE3 of the key's bytes).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Telemetry label: the key truncated to [`MAX_KEY_LABEL_CHARS`] characters, or `key:` + 8 hex
    /// digits of its hash when `redact` is set.
    pub fn label(&self, redact: bool) -> String {
        if redact {
            hash_label("key:", self.position)
        } else {
            match self.key.char_indices().nth(MAX_KEY_LABEL_CHARS) {
                Some((cut, _)) => self.key[..cut].to_owned(),
                None => self.key.to_owned(),
            }
        }
    }
}

/// Which header gave an implicit key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImplicitSource {
    /// `Authorization`.
    Authorization,
    /// `X-Forwarded-For`.
    ForwardedFor,
    /// `Cookie`.
    Cookie,
}

/// An implicit key: only its ring position and source header survive extraction, so the credential
/// itself cannot leak through this type.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImplicitKey {
    position: u64,
    source: ImplicitSource,
}

impl ImplicitKey {
    /// Hashes an implicit header value; the value is not kept.
    pub fn from_value(source: ImplicitSource, value: &[u8]) -> Self {
        Self {
            position: hash_position(value),
            source,
        }
    }

    /// Ring position of the value.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Header the key came from.
    pub fn source(&self) -> ImplicitSource {
        self.source
    }

    /// `implicit:` + 8 hex digits of the hash: the only way this key is ever shown.
    pub fn label(&self) -> String {
        hash_label("implicit:", self.position)
    }
}

impl fmt::Debug for ImplicitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImplicitKey({}, {:?})", self.label(), self.source)
    }
}

impl fmt::Display for ImplicitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Why an explicit routing key header was ignored (counted in a metric; the request proceeds as if
/// the header were absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IgnoredKey {
    /// The header was present but empty.
    Empty,
    /// Over [`MAX_EXPLICIT_KEY_BYTES`] bytes.
    TooLong,
    /// Not valid UTF-8.
    NotUtf8,
    /// Holds a control character (Unicode `Cc`: U+0000–U+001F including tab, U+007F–U+009F).
    ControlCharacter,
    /// Begins or ends with a space (which an HTTP parser would have dropped).
    SurroundingSpace,
}

impl IgnoredKey {
    /// Every reason, in documentation order; `ALL[reason.index()]` is `reason` (metric slots).
    pub const ALL: [IgnoredKey; 5] = [
        IgnoredKey::Empty,
        IgnoredKey::TooLong,
        IgnoredKey::NotUtf8,
        IgnoredKey::ControlCharacter,
        IgnoredKey::SurroundingSpace,
    ];

    /// Position in [`IgnoredKey::ALL`], for per-reason counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            IgnoredKey::Empty => "empty",
            IgnoredKey::TooLong => "too_long",
            IgnoredKey::NotUtf8 => "not_utf8",
            IgnoredKey::ControlCharacter => "control_character",
            IgnoredKey::SurroundingSpace => "surrounding_space",
        }
    }
}

/// Result of extraction: the key, and whether an explicit key header was present but ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extracted<'a> {
    /// The key to route by.
    pub key: RoutingKey<'a>,
    /// Set when the explicit key header was present but unusable.
    pub ignored_explicit: Option<IgnoredKey>,
}

/// Extracts the routing key. `header(name)` returns the first value of the header named `name`
/// (lower case), as raw bytes; the caller matches names case-insensitively (as `http::HeaderMap`
/// does).
pub fn extract<'a>(
    headers: &RoutingHeaders,
    header: impl Fn(&str) -> Option<&'a [u8]>,
) -> Extracted<'a> {
    if let Some(raw) = header(&headers.target_worker).filter(|v| !v.is_empty()) {
        return Extracted {
            key: RoutingKey::Target(raw),
            ignored_explicit: None,
        };
    }
    let mut ignored_explicit = None;
    if let Some(raw) = header(&headers.routing_key) {
        match ExplicitKey::parse(raw) {
            Ok(key) => {
                return Extracted {
                    key: RoutingKey::Explicit(key),
                    ignored_explicit: None,
                };
            }
            Err(reason) => ignored_explicit = Some(reason),
        }
    }
    let sources = [
        ImplicitSource::Authorization,
        ImplicitSource::ForwardedFor,
        ImplicitSource::Cookie,
    ];
    for (name, source) in IMPLICIT_KEY_HEADERS.iter().zip(sources) {
        if let Some(value) = header(name).filter(|v| !v.is_empty()) {
            return Extracted {
                key: RoutingKey::Implicit(ImplicitKey::from_value(source, value)),
                ignored_explicit,
            };
        }
    }
    Extracted {
        key: RoutingKey::None,
        ignored_explicit,
    }
}

fn hash_label(prefix: &str, position: u64) -> String {
    format!("{prefix}{:08x}", (position >> 32) as u32)
}

#[cfg(test)]
mod tests {

    #[test]
    fn ignored_key_indices_match_all() {
        for (i, reason) in IgnoredKey::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
    }

    use super::*;

    fn lookup<'a>(pairs: &'a [(&'a str, &'a [u8])]) -> impl Fn(&str) -> Option<&'a [u8]> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    #[test]
    fn precedence_target_then_explicit_then_implicit() {
        let h = RoutingHeaders::default();
        let all: &[(&str, &[u8])] = &[
            ("x-smg-target-worker", b"w1"),
            ("x-smg-routing-key", b"k"),
            ("authorization", b"Bearer s3cret"),
        ];
        assert_eq!(extract(&h, lookup(all)).key, RoutingKey::Target(b"w1"));
        assert!(matches!(
            extract(&h, lookup(&all[1..])).key,
            RoutingKey::Explicit(k) if k.as_str() == "k"
        ));
        assert!(matches!(
            extract(&h, lookup(&all[2..])).key,
            RoutingKey::Implicit(k) if k.source() == ImplicitSource::Authorization
        ));
        assert_eq!(extract(&h, lookup(&[])).key, RoutingKey::None);
    }

    #[test]
    fn implicit_takes_first_non_empty() {
        let h = RoutingHeaders::default();
        let pairs: &[(&str, &[u8])] = &[
            ("authorization", b""),
            ("x-forwarded-for", b""),
            ("cookie", b"sid=1"),
        ];
        let got = extract(&h, lookup(pairs)).key;
        assert_eq!(
            got,
            RoutingKey::Implicit(ImplicitKey::from_value(ImplicitSource::Cookie, b"sid=1"))
        );
    }

    #[test]
    fn invalid_explicit_keys_are_ignored_and_reported() {
        let h = RoutingHeaders::default();
        let long = [b'a'; MAX_EXPLICIT_KEY_BYTES + 1];
        let exact = [b'a'; MAX_EXPLICIT_KEY_BYTES];
        for (raw, reason) in [
            (&b""[..], IgnoredKey::Empty),
            (&long[..], IgnoredKey::TooLong),
            (&b"\xff\xfe"[..], IgnoredKey::NotUtf8),
            (&b"a\x00b"[..], IgnoredKey::ControlCharacter),
            (&b"a\tb"[..], IgnoredKey::ControlCharacter),
            (&b"a\r\nb"[..], IgnoredKey::ControlCharacter),
            ("a\u{85}b".as_bytes(), IgnoredKey::ControlCharacter),
            (&b" ab"[..], IgnoredKey::SurroundingSpace),
            (&b"ab "[..], IgnoredKey::SurroundingSpace),
        ] {
            let pairs: &[(&str, &[u8])] = &[("x-smg-routing-key", raw), ("cookie", b"c")];
            let got = extract(&h, lookup(pairs));
            assert_eq!(got.ignored_explicit, Some(reason));
            assert!(matches!(got.key, RoutingKey::Implicit(_)));
        }
        for valid in [&exact[..], b"a b", "caf\u{e9}".as_bytes()] {
            let pairs: &[(&str, &[u8])] = &[("x-smg-routing-key", valid)];
            assert!(matches!(
                extract(&h, lookup(pairs)).key,
                RoutingKey::Explicit(_)
            ));
        }
    }

    #[test]
    fn implicit_value_never_printed() {
        let secret = b"Bearer sk-live-TOPSECRET";
        let key = ImplicitKey::from_value(ImplicitSource::Authorization, secret);
        let shown = format!("{key:?} {key} {:?}", RoutingKey::Implicit(key));
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(key.label().starts_with("implicit:"));
        assert_eq!(key.label().len(), "implicit:".len() + 8);
    }

    #[test]
    fn explicit_labels_truncate_by_characters_or_redact() {
        let text = format!("{}{}", "é".repeat(40), "a".repeat(40));
        let key = ExplicitKey::parse(text.as_bytes()).unwrap();
        assert_eq!(key.label(false).chars().count(), MAX_KEY_LABEL_CHARS);
        let redacted = key.label(true);
        assert!(redacted.starts_with("key:") && !redacted.contains('é'));
    }
}
