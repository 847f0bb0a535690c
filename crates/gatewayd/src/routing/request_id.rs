//! A request's id: the client's own `x-request-id` when it sent a usable one, else one made here.
//! It goes to the worker, back to the client and into the access-log line, so one request can be
//! followed through all three.
//!
//! The gateway's ids are version-4-shaped UUIDs (`xxxxxxxx-xxxx-4xxx-8nnn-nnnnnnnnnnnn`): 60 random
//! bits per process, so ids of two replicas or two runs do not collide, then a per-process counter
//! in the low 60 bits, so ids are unique within a process without a random draw per request. They
//! are UUID-shaped because workers may insist: llama-cpp-python's server answers 400 to any
//! `x-request-id` that does not parse as a UUID. An id is rendered only when something needs it
//! (the picker only logs it), into a stack buffer for the log line.

use std::hash::{BuildHasher, Hasher};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use http::header::{HeaderName, HeaderValue};
use uuid::Uuid;
use uuid::fmt::Hyphenated;

/// `x-request-id`: the request's id, kept from the client or made by the gateway, forwarded to
/// the worker and returned to the client.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-sent request id kept, bytes; a longer one (or one that is not visible ASCII) is
/// replaced by the gateway's own.
const MAX_CLIENT_ID: usize = 128;

/// The number of the next id this gateway makes.
static NEXT_NUMBER: AtomicU64 = AtomicU64::new(1);

/// The per-process half of the gateway's ids: 60 random bits with the UUID version nibble `4`.
static PROCESS_BITS: LazyLock<u64> = LazyLock::new(|| {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (random & !0xf000) | 0x4000
});

/// A buffer an id is rendered into: a hyphenated UUID's 36 characters.
pub type IdBuffer = [u8; Hyphenated::LENGTH];

/// An empty [`IdBuffer`], on the stack.
pub fn id_buffer() -> IdBuffer {
    [0; Hyphenated::LENGTH]
}

/// One request's id.
pub enum RequestId {
    /// The client's own, kept because it is usable.
    Client(HeaderValue),
    /// One this gateway made: its number, and its header value once something needed it.
    Ours {
        /// Position in this process's sequence of ids (the low 60 bits are rendered).
        number: u64,
        /// The rendered id, made on first need.
        header: Option<HeaderValue>,
    },
}

impl RequestId {
    /// The client's id when `client` is usable (visible ASCII of at most 128 bytes), else the
    /// next of this gateway's own.
    pub fn new(client: Option<HeaderValue>) -> Self {
        match client.filter(usable) {
            Some(id) => RequestId::Client(id),
            None => RequestId::Ours {
                number: NEXT_NUMBER.fetch_add(1, Ordering::Relaxed),
                header: None,
            },
        }
    }

    /// Whether the gateway made this id (so the worker must be sent it).
    pub fn is_ours(&self) -> bool {
        matches!(self, RequestId::Ours { .. })
    }

    /// The id as a header value, rendered on first call.
    pub fn header_value(&mut self) -> &HeaderValue {
        match self {
            RequestId::Client(id) => id,
            RequestId::Ours { number, header } => header.get_or_insert_with(|| {
                let mut buffer = id_buffer();
                HeaderValue::from_str(render(*number, &mut buffer))
                    .expect("hex digits and dashes are a valid header value")
            }),
        }
    }

    /// The id as text, for the log line: rendered into `buffer` when not rendered yet.
    pub fn text<'a>(&'a self, buffer: &'a mut IdBuffer) -> &'a str {
        match self {
            RequestId::Client(id)
            | RequestId::Ours {
                header: Some(id), ..
            } => id.to_str().unwrap_or("-"),
            RequestId::Ours {
                number,
                header: None,
            } => render(*number, buffer),
        }
    }
}

/// A client's id is kept when it is visible ASCII of at most [`MAX_CLIENT_ID`] bytes.
fn usable(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_CLIENT_ID && bytes.iter().all(|b| b.is_ascii_graphic())
}

/// The id numbered `number`: the process's bits, the RFC 4122 variant digit `8`, then the low 60
/// bits of `number` (`…-8nnn-nnnnnnnnnnnn`).
fn uuid(number: u64) -> Uuid {
    Uuid::from_u64_pair(*PROCESS_BITS, (8 << 60) | (number & ((1 << 60) - 1)))
}

/// Writes the id numbered `number` into `buffer`, lowercase and hyphenated.
fn render(number: u64, buffer: &mut IdBuffer) -> &str {
    uuid(number).hyphenated().encode_lower(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_request_id() -> String {
        let mut id = RequestId::new(None);
        id.header_value().to_str().unwrap().to_owned()
    }

    #[test]
    fn generated_ids_are_version_4_uuids_numbered_per_process() {
        let (a, b) = (new_request_id(), new_request_id());
        let groups: Vec<&str> = a.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups.concat().bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(groups[2].starts_with('4'), "version 4: {a}");
        assert!(groups[3].starts_with('8'), "RFC 4122 variant: {a}");
        assert_eq!(a[..20], b[..20], "one prefix per process");
        let counter = |id: &str| u64::from_str_radix(&id[20..].replace('-', ""), 16).unwrap();
        assert_eq!(counter(&b), counter(&a) + 1);
        let parsed = Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn the_counter_fills_its_fifteen_digits() {
        let mut buffer = id_buffer();
        assert_eq!(
            &render(0x0123_4567_89ab_cdef, &mut buffer)[19..],
            "8123-456789abcdef"
        );
        assert_eq!(&render(1, &mut buffer)[19..], "8000-000000000001");
    }

    #[test]
    fn a_usable_client_id_is_kept_and_an_unusable_one_replaced() {
        let kept = HeaderValue::from_static("client-42");
        let mut id = RequestId::new(Some(kept.clone()));
        assert!(!id.is_ours());
        assert_eq!(id.header_value(), &kept);
        let long = HeaderValue::from_str(&"x".repeat(MAX_CLIENT_ID + 1)).unwrap();
        for unusable in [
            HeaderValue::from_static(""),
            HeaderValue::from_static("a b"),
            long,
        ] {
            let mut id = RequestId::new(Some(unusable));
            assert!(id.is_ours());
            let mut buffer = id_buffer();
            let text = id.text(&mut buffer).to_owned();
            assert_eq!(id.header_value().to_str().unwrap(), text);
        }
    }
}
