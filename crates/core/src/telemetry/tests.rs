//! Unit tests of the telemetry wire types.

use super::*;

#[test]
fn worker_sources_round_trip_and_bad_ones_are_refused() {
    for source in [
        WorkerSource::Static,
        WorkerSource::Dns("_http._tcp.a.b".into()),
    ] {
        let json = serde_json::to_value(&source).unwrap();
        assert_eq!(json, source.label().as_ref());
        assert_eq!(
            serde_json::from_value::<WorkerSource>(json).unwrap(),
            source
        );
    }
    for bad in ["", "dns:", "consul:x", "Static"] {
        assert!(
            serde_json::from_value::<WorkerSource>(bad.into()).is_err(),
            "{bad:?}"
        );
    }
    // A record without a source (an older gateway's) is static: tests/protocol.rs reads one.
}

#[test]
fn change_source_names_match_the_wire() {
    for source in ChangeSource::ALL {
        assert_eq!(serde_json::to_value(source).unwrap(), source.as_str());
    }
}

#[test]
fn frame_json_is_flat_and_round_trips() {
    let frame = ServerFrame::new(
        3,
        ServerMessage::Error(CommandError {
            id: Some(CommandId::Number(7)),
            message: "max_load_skew must be >= 1.0".into(),
        }),
    );
    let json = serde_json::to_value(&frame).unwrap();
    assert_eq!(json["v"], 1);
    assert_eq!(json["seq"], 3);
    assert_eq!(json["type"], "error");
    assert_eq!(json["id"], 7);
    let back: ServerFrame = serde_json::from_value(json).unwrap();
    assert_eq!(back, frame);
}

#[test]
fn client_commands_parse_and_reject_unknown_fields() {
    let cmd: ClientCommand =
        serde_json::from_str(r#"{"type":"set_policy","id":"a","min_load_gap":3}"#).unwrap();
    assert_eq!(
        cmd,
        ClientCommand::SetPolicy {
            id: Some(CommandId::Text("a".into())),
            kind: None,
            min_load_gap: Some(3),
            max_load_skew: None,
            spill_order: None,
            load_source: None,
            admission: None,
        }
    );
    let cmd: ClientCommand =
        serde_json::from_str(r#"{"type":"set_policy","spill_order":"hash_seeded"}"#).unwrap();
    assert!(matches!(
        cmd,
        ClientCommand::SetPolicy {
            spill_order: Some(SpillOrder::HashSeeded),
            ..
        }
    ));
    assert!(
        serde_json::from_str::<ClientCommand>(r#"{"type":"set_policy","spill_order":"next"}"#)
            .is_err()
    );
    let resync: ClientCommand = serde_json::from_str(r#"{"type":"resync"}"#).unwrap();
    assert_eq!(resync, ClientCommand::Resync { id: None });
    assert!(serde_json::from_str::<ClientCommand>(r#"{"type":"set_policy","gap":1}"#).is_err());
    assert!(
        serde_json::from_str::<ClientCommand>(r#"{"type":"set_policy","min_load_gap":-1}"#)
            .is_err()
    );
}
