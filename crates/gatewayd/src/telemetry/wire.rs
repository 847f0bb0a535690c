//! The telemetry wire: messages serialised once per frame and wrapped per connection in the
//! `{"v":1,"seq":N,...}` envelope (docs/protocol.md), and the ring ownership record.

use std::sync::Arc;

use bch_core::ring::Ring;
use bch_core::router::RoutingTable;
use bch_core::telemetry::{RingOwnership, RingShare, ServerMessage};

/// Serialises a message body once (`{"type":...}`); each connection adds its own envelope.
pub fn encode_message(message: &ServerMessage) -> Arc<str> {
    serde_json::to_string(message)
        .expect("telemetry messages always serialise")
        .into()
}

/// Wraps a pre-serialised message body in the `{"v":1,"seq":N,...}` envelope.
pub fn envelope(seq: u64, body: &str) -> String {
    let rest = body.strip_prefix('{').unwrap_or(body);
    let mut frame = String::with_capacity(body.len() + 24);
    frame.push_str("{\"v\":");
    frame.push_str(&bch_core::telemetry::PROTOCOL_VERSION.to_string());
    frame.push_str(",\"seq\":");
    frame.push_str(&seq.to_string());
    if rest != "}" {
        frame.push(',');
    }
    frame.push_str(rest);
    frame
}

/// Each worker's share of the hash space and its arcs as fractions of the ring.
pub fn ring_ownership(table: &RoutingTable) -> RingOwnership {
    let ring: &Ring = table.ring();
    let shares = ring.shares();
    let mut arcs: Vec<Vec<[f64; 2]>> = vec![Vec::new(); table.workers().len()];
    let scale = 2f64.powi(64);
    for (owner, arc) in ring.arcs() {
        let start = arc.start_exclusive.map_or(0.0, |s| s as f64 / scale);
        let end = (arc.end_inclusive as f64 / scale).min(1.0);
        arcs[owner].push([round6(start), round6(end)]);
    }
    RingOwnership {
        virtual_nodes: ring.virtual_nodes(),
        workers: table
            .workers()
            .iter()
            .zip(shares)
            .zip(arcs)
            .map(|((w, share), arcs)| RingShare {
                name: w.spec.name.clone(),
                share,
                arcs,
            })
            .collect(),
    }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_prefixes_version_and_seq() {
        assert_eq!(
            envelope(5, r#"{"type":"ack","policy":1}"#),
            r#"{"v":1,"seq":5,"type":"ack","policy":1}"#
        );
        assert_eq!(envelope(0, "{}"), r#"{"v":1,"seq":0}"#);
    }
}
