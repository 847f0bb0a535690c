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

#[test]
fn open_names_serialise_like_the_enums_and_keep_unknown_ones() {
    let known: Open<KeyKind> = KeyKind::Implicit.into();
    assert_eq!(serde_json::to_value(&known).unwrap(), "implicit");
    assert_eq!(
        serde_json::from_value::<Open<KeyKind>>("implicit".into()).unwrap(),
        known
    );
    let unknown: Open<KeyKind> = serde_json::from_value("semantic".into()).unwrap();
    assert_eq!(unknown, Open::Unknown("semantic".into()));
    assert_eq!(serde_json::to_value(&unknown).unwrap(), "semantic");
    assert_eq!(unknown.to_string(), "semantic");
    // A name that is not a string is still an error: the frame is not the protocol's.
    assert!(serde_json::from_value::<Open<KeyKind>>(7.into()).is_err());
    let source: Open<WorkerSource> = serde_json::from_value("dns:_x._tcp".into()).unwrap();
    assert_eq!(source, WorkerSource::Dns("_x._tcp".into()));
}

#[test]
fn policy_record_json_is_the_policy_settings_json() {
    let settings = crate::policy::PolicySettings {
        spill_order: SpillOrder::HashSeeded,
        ..Default::default()
    };
    let record = PolicyRecord::from(settings);
    assert_eq!(
        serde_json::to_value(&record).unwrap(),
        serde_json::to_value(settings).unwrap()
    );
    assert_eq!(record.settings(), Some(settings));
    let mut newer = serde_json::to_value(settings).unwrap();
    newer["kind"] = "prefix_aware".into();
    let read: PolicyRecord = serde_json::from_value(newer).unwrap();
    assert_eq!(read.settings(), None);
    assert_eq!(read.unknown_names(), ["kind prefix_aware"]);
}
