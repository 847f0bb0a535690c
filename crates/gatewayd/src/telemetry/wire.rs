//! The telemetry wire: messages serialised once per frame and protocol version, and wrapped per
//! connection in the `{"v":N,"seq":N,...}` envelope (docs/protocol.md).

use std::sync::Arc;

use bch_core::router::RoutingTable;
use bch_core::telemetry::{RingOwnership, ServerMessage};

/// Serialises a message body once (`{"type":...}`); each connection adds its own envelope.
pub fn encode_message(message: &ServerMessage) -> Arc<str> {
    serde_json::to_string(message)
        .expect("telemetry messages always serialise")
        .into()
}

/// Wraps a pre-serialised message body in the `{"v":VERSION,"seq":N,...}` envelope.
pub fn envelope(version: u32, seq: u64, body: &str) -> String {
    let rest = body.strip_prefix('{').unwrap_or(body);
    let mut frame = String::with_capacity(body.len() + 24);
    frame.push_str("{\"v\":");
    frame.push_str(&version.to_string());
    frame.push_str(",\"seq\":");
    frame.push_str(&seq.to_string());
    if rest != "}" {
        frame.push(',');
    }
    frame.push_str(rest);
    frame
}

/// `body` as a read-only connection gets it: a snapshot says `"read_only":true` (the field is
/// spliced in, so the snapshot encoded once for every client is not encoded again); every other
/// message is unchanged.
pub fn for_read_only(body: &str) -> std::borrow::Cow<'_, str> {
    const SNAPSHOT: &str = "{\"type\":\"snapshot\",";
    match body.strip_prefix(SNAPSHOT) {
        Some(rest) => format!("{SNAPSHOT}\"read_only\":true,{rest}").into(),
        None => body.into(),
    }
}

/// Each worker's share of the hash space and its arcs as fractions of the ring (bch-core's one
/// computation, which version 2 clients repeat from the worker records).
pub fn ring_ownership(table: &RoutingTable) -> RingOwnership {
    let names: Vec<&str> = table
        .workers()
        .iter()
        .map(|w| w.spec.name.as_str())
        .collect();
    RingOwnership::of_ring(table.ring(), &names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_prefixes_version_and_seq() {
        assert_eq!(
            envelope(1, 5, r#"{"type":"ack","policy":1}"#),
            r#"{"v":1,"seq":5,"type":"ack","policy":1}"#
        );
        assert_eq!(envelope(2, 0, "{}"), r#"{"v":2,"seq":0}"#);
    }
}
