//! Wire-format snapshots of every telemetry message (docs/protocol.md quotes them). A change here is
//! a protocol change: bump `PROTOCOL_VERSION` if it is incompatible, and update docs/protocol.md.

use std::collections::BTreeMap;

use bch_core::admission::{AdmissionPatch, AdmissionSettings};
use bch_core::fleet_load::{LoadSignal, LoadSource};
use bch_core::policy::{Branch, PolicyKind, PolicySettings, SpillOrder};
use bch_core::telemetry::*;

fn policy() -> PolicySettings {
    PolicySettings {
        kind: PolicyKind::BoundedConsistentHashing,
        min_load_gap: 2,
        max_load_skew: 1.5,
        spill_order: SpillOrder::Ring,
        virtual_nodes: 150,
        load_source: LoadSource::WorkerMetrics,
        admission: AdmissionSettings {
            max_in_flight_per_worker: 4,
            queue_timeout_ms: 2000,
            ..AdmissionSettings::default()
        },
    }
}

fn worker(name: &str, active: u64, healthy: bool) -> WorkerRecord {
    WorkerRecord {
        name: name.into(),
        url: format!("http://10.0.0.{}:8000", name.len()),
        ring_id: None,
        healthy,
        state: if active == 2 {
            WorkerState::Draining.into()
        } else {
            WorkerState::Active.into()
        },
        active,
        requests_total: 120 + active,
        spilled_in_total: 3,
        spilled_out_total: 1,
        errors_total: 0,
        load: Some(active + 2),
        reported_load: Some(active + 2),
        scrape_age_ms: Some(40),
        load_stale: !healthy,
        source: Default::default(),
        capacity: Some(4),
        full: active + 2 >= 4,
        probe_failure: None,
        models: Vec::new(),
        reported_models: None,
    }
}

fn ring() -> RingOwnership {
    RingOwnership {
        virtual_nodes: 150,
        workers: vec![
            RingShare {
                name: "gpu-a".into(),
                share: 0.512,
                arcs: vec![[0.0, 0.25], [0.5, 0.762]],
            },
            RingShare {
                name: "gpu-b".into(),
                share: 0.488,
                arcs: vec![[0.25, 0.5], [0.762, 1.0]],
            },
        ],
    }
}

fn key() -> KeyRecord {
    KeyRecord {
        key: "session-42".into(),
        kind: KeyKind::Explicit.into(),
        preferred: "gpu-a".into(),
        current: "gpu-b".into(),
        active: BTreeMap::from([("gpu-a".into(), 3), ("gpu-b".into(), 1)]),
        requests_total: 9,
        spills_total: 1,
        last_seen_ms: 1_764_500_000_123,
    }
}

fn spill() -> SpillEvent {
    SpillEvent {
        ts_ms: 1_764_500_000_123,
        key: "session-42".into(),
        branch: Branch::ExplicitRoutingKeySpillover.into(),
        from: "gpu-a".into(),
        to: "gpu-b".into(),
        preferred_load: 3,
        min_load: 0,
        mean_load: 1.5,
        min_load_gap: 2,
        max_load_skew: 1.5,
        load_signal: LoadSignal::WorkerMetrics.into(),
        cause: SpillCause::Bound.into(),
    }
}

fn totals() -> Totals {
    Totals {
        requests_per_s: 42.0,
        spills_per_s: 2.5,
        requests_total: 1234,
        spills_total: 56,
    }
}

/// A gateway shedding about a third of a storm, with six requests waiting.
fn admission() -> AdmissionSummary {
    AdmissionSummary {
        waiting: 6,
        admitted_per_s: 20.0,
        shed_per_s: 10.5,
        shed_per_s_by_reason: ShedRates {
            no_queue: 0.0,
            queue_full: 0.5,
            queue_timeout: 10.0,
            shutdown: 0.0,
        },
        admitted_total: 4_210,
        shed_total: 96,
    }
}

fn frames() -> Vec<(&'static str, ServerFrame)> {
    let ts_ms = 1_764_500_000_000;
    vec![
        (
            "snapshot",
            ServerFrame::new(
                0,
                ServerMessage::Snapshot(Snapshot {
                    ts_ms,
                    policy: policy().into(),
                    workers: vec![worker("gpu-a", 3, true), worker("gpu-b", 1, true)],
                    ring: Some(ring()),
                    keys: vec![key()],
                    spills: vec![spill()],
                    totals: totals(),
                    discovery: Vec::new(),
                    admission: None,
                    read_only: false,
                }),
            ),
        ),
        (
            "tick",
            ServerFrame::new(
                1,
                ServerMessage::Tick(Tick {
                    ts_ms,
                    workers: vec![worker("gpu-b", 2, false)],
                    keys: vec![key()],
                    removed_keys: vec!["implicit:9f86d081".into()],
                    spills: vec![spill()],
                    totals: totals(),
                    dropped_events: 0,
                    discovery: None,
                    admission: Some(admission()),
                }),
            ),
        ),
        (
            "tick_discovery",
            ServerFrame::new(
                7,
                ServerMessage::Tick(Tick {
                    ts_ms,
                    workers: vec![],
                    keys: vec![],
                    removed_keys: vec![],
                    spills: vec![],
                    totals: totals(),
                    dropped_events: 0,
                    discovery: Some(vec![
                        DiscoverySource {
                            name: "_http._tcp.llm.default.svc.cluster.local.".into(),
                            source: "dns:_http._tcp.llm.default.svc.cluster.local.".into(),
                            kind: DiscoveryKind::Srv.into(),
                            state: DiscoveryState::Ok.into(),
                            last_error: None,
                            last_error_ms: None,
                            last_good_ms: Some(ts_ms - 1_200),
                            last_good_age_ms: Some(1_200),
                            workers: 8,
                        },
                        DiscoverySource {
                            name: "llm.example".into(),
                            source: "dns:llm.example".into(),
                            kind: DiscoveryKind::Address.into(),
                            state: DiscoveryState::Failing.into(),
                            last_error: Some("no answer within timeout_ms 2000".into()),
                            last_error_ms: Some(ts_ms - 300),
                            last_good_ms: Some(ts_ms - 95_000),
                            last_good_age_ms: Some(95_000),
                            workers: 2,
                        },
                    ]),
                    admission: None,
                }),
            ),
        ),
        (
            "ring",
            ServerFrame::new(
                2,
                ServerMessage::Ring(RingUpdate {
                    ts_ms,
                    workers: vec![worker("gpu-a", 0, true), worker("gpu-b", 0, true)],
                    ring: ring(),
                }),
            ),
        ),
        (
            "snapshot_v2",
            ServerFrame {
                v: 2,
                seq: 0,
                message: ServerMessage::Snapshot(Snapshot {
                    ts_ms,
                    policy: policy().into(),
                    workers: vec![
                        worker("gpu-a", 3, true),
                        WorkerRecord {
                            ring_id: Some("gpu-b.rack-2".into()),
                            ..worker("gpu-b", 1, true)
                        },
                    ],
                    ring: None,
                    keys: vec![],
                    spills: vec![],
                    totals: totals(),
                    discovery: Vec::new(),
                    admission: None,
                    read_only: false,
                }),
            },
        ),
        (
            "membership",
            ServerFrame {
                v: 2,
                seq: 2,
                message: ServerMessage::Membership(MembershipUpdate {
                    ts_ms,
                    virtual_nodes: 150,
                    removed: vec!["gpu-c".into()],
                    changed: vec![WorkerRecord {
                        url: "http://10.0.0.9:8000".into(),
                        ..worker("gpu-b", 0, true)
                    }],
                    added: vec![PlacedWorker {
                        index: 0,
                        worker: worker("gpu-0", 0, true),
                    }],
                    worker_count: 3,
                }),
            },
        ),
        (
            "policy",
            ServerFrame::new(
                3,
                ServerMessage::Policy(PolicyUpdate {
                    ts_ms,
                    policy: policy().into(),
                    changed_by: ChangeSource::Http.into(),
                    client: Some("10.0.0.9:51234".into()),
                }),
            ),
        ),
        (
            "ack",
            ServerFrame::new(
                4,
                ServerMessage::Ack(Ack {
                    id: Some(CommandId::Number(7)),
                    policy: policy().into(),
                    worker: None,
                }),
            ),
        ),
        (
            "drained",
            ServerFrame::new(
                6,
                ServerMessage::Drained(DrainedUpdate {
                    ts_ms,
                    worker: "gpu-b".into(),
                    removed: true,
                }),
            ),
        ),
        (
            "error",
            ServerFrame::new(
                5,
                ServerMessage::Error(CommandError {
                    id: Some(CommandId::Number(8)),
                    message: "max_load_skew must be a finite number >= 1.0, got 0.95".into(),
                }),
            ),
        ),
    ]
}

#[test]
fn every_server_message_has_a_stable_shape() {
    for (name, frame) in frames() {
        insta::assert_json_snapshot!(name, frame, {
            ".ts_ms" => "[ts_ms]",
            ".**.ts_ms" => "[ts_ms]",
            ".**.last_seen_ms" => "[ts_ms]",
        });
        let json = serde_json::to_string(&frame).unwrap();
        let back: ServerFrame = serde_json::from_str(&json).unwrap();
        assert_eq!(back, frame, "{name} round-trips");
    }
}

#[test]
fn client_commands_have_a_stable_shape() {
    let set_policy = ClientCommand::SetPolicy {
        id: Some(CommandId::Number(7)),
        kind: None,
        min_load_gap: Some(3),
        max_load_skew: Some(1.25),
        spill_order: Some(SpillOrder::HashSeeded),
        load_source: Some(LoadSource::WorkerMetrics),
        admission: Some(AdmissionPatch {
            max_in_flight_per_worker: Some(8),
            ..AdmissionPatch::default()
        }),
    };
    insta::assert_json_snapshot!("set_policy", set_policy);
    insta::assert_json_snapshot!("resync", ClientCommand::Resync { id: None });
    let drain = ClientCommand::Drain {
        id: Some(CommandId::Number(9)),
        worker: "gpu-b".into(),
        remove: true,
    };
    insta::assert_json_snapshot!("drain", drain);
    let undrain = ClientCommand::Undrain {
        id: Some(CommandId::Number(10)),
        worker: "gpu-b".into(),
    };
    insta::assert_json_snapshot!("undrain", undrain);
}

#[test]
fn a_worker_record_without_a_state_or_source_is_active_and_static() {
    // Frames of a gateway from before drain and discovery existed.
    let json = r#"{"name":"w","url":"http://w:1","healthy":true,"active":0,"requests_total":0,
        "spilled_in_total":0,"spilled_out_total":0,"errors_total":0}"#;
    let record: WorkerRecord = serde_json::from_str(json).unwrap();
    assert_eq!(record.state, WorkerState::Active);
    assert_eq!(record.source, WorkerSource::Static);
}

#[test]
fn unknown_fields_from_a_newer_server_are_ignored() {
    let json = r#"{"v":1,"seq":9,"type":"policy","ts_ms":1,"changed_by":"ws","future":true,
        "policy":{"kind":"round_robin","min_load_gap":0,"max_load_skew":1.0,"virtual_nodes":150,
        "future_policy_field":"x"}}"#;
    let frame: ServerFrame = serde_json::from_str(json).unwrap();
    assert_eq!(frame.seq, 9);
    // Inside the policy too: a newer server may add a setting.
    let json = r#"{"v":1,"seq":9,"type":"policy","ts_ms":1,"changed_by":"ws",
        "policy":{"kind":"round_robin","min_load_gap":0,"max_load_skew":1.0,"virtual_nodes":150,
        "load_source":"worker_metrics","future":1}}"#;
    let frame: ServerFrame = serde_json::from_str(json).unwrap();
    let ServerMessage::Policy(update) = frame.message else {
        panic!("a policy frame")
    };
    assert_eq!(update.policy.load_source, LoadSource::WorkerMetrics);
}

#[test]
fn records_from_a_gateway_without_fleet_load_still_parse() {
    let json = r#"{"name":"w","url":"http://a","healthy":true,"active":3,"requests_total":9,
        "spilled_in_total":0,"spilled_out_total":0,"errors_total":0}"#;
    let record: WorkerRecord = serde_json::from_str(json).unwrap();
    assert_eq!((record.load, record.load_stale), (None, false));
    assert_eq!(record.rule_load(), 3);
}

/// A capacity spill travels under a branch name every console knows, with its cause beside it;
/// an event without a cause is a bound spill.
#[test]
fn capacity_spills_stay_readable_by_older_consoles() {
    let (branch, cause) = SpillCause::of(Branch::ExplicitRoutingKeyCapacitySpill);
    assert_eq!(
        (branch, cause),
        (Branch::ExplicitRoutingKeySpillover, SpillCause::Capacity)
    );
    assert_eq!(
        SpillCause::of(Branch::ExplicitRoutingKeyNoEligibleCandidate),
        (
            Branch::ExplicitRoutingKeyNoEligibleCandidate,
            SpillCause::Bound
        )
    );
    let event = SpillEvent {
        branch: branch.into(),
        cause: cause.into(),
        ..spill()
    };
    let json = serde_json::to_value(&event).unwrap();
    assert_eq!(json["branch"], "explicit_routing_key_spillover");
    assert_eq!(json["cause"], "capacity");
    assert_eq!(serde_json::from_value::<SpillEvent>(json).unwrap(), event);
    let bound = serde_json::to_value(spill()).unwrap();
    assert!(bound.get("cause").is_none(), "{bound}");
}

/// A tick from a gateway that predates admission has no summary; the summary of several replicas
/// adds queue lengths, rates and totals.
#[test]
fn admission_summaries_are_optional_and_add_up_across_replicas() {
    let json = r#"{"v":1,"seq":1,"type":"tick","ts_ms":1,"workers":[],"keys":[],"spills":[],
        "totals":{"requests_per_s":0.0,"spills_per_s":0.0,"requests_total":0,"spills_total":0},
        "dropped_events":0}"#;
    let ServerMessage::Tick(tick) = serde_json::from_str::<ServerFrame>(json).unwrap().message
    else {
        panic!("a tick")
    };
    assert_eq!(tick.admission, None);
    let sum = AdmissionSummary::sum([&admission(), &admission()]);
    assert_eq!(sum.waiting, 12);
    assert_eq!(sum.shed_per_s, 21.0);
    assert_eq!(sum.shed_per_s_by_reason.queue_timeout, 20.0);
    assert_eq!((sum.admitted_total, sum.shed_total), (8_420, 192));
}

#[test]
fn an_unknown_message_type_still_parses_with_its_seq() {
    // A newer gateway's message: the client must count its seq (or it would take the next frame
    // for a gap and resync) and skip it.
    let json = r#"{"v":2,"seq":4,"type":"a_frame_from_the_future","payload":{"x":1}}"#;
    let frame: ServerFrame = serde_json::from_str(json).unwrap();
    assert_eq!((frame.v, frame.seq), (2, 4));
    assert_eq!(frame.message, ServerMessage::Unknown);
}

/// Ring shares are `f64`s that a console compares with the ones it computes itself: a frame must
/// carry them exactly. serde_json's default float parser may miss the nearest `f64` by one unit in
/// the last place (its `float_roundtrip` feature makes it exact), which made a console's own ring
/// differ from the gateway's for some worker URLs.
#[test]
fn ring_shares_survive_the_wire_exactly() {
    for port in 30000..30400u32 {
        let identities = [
            format!("http://127.0.0.1:{port}"),
            format!("http://127.0.0.1:{}", port + 1000),
            format!("http://127.0.0.1:{}", port + 2000),
        ];
        let ring = bch_core::ring::Ring::build(&identities, 150);
        let sent = RingOwnership::of_ring(&ring, &identities);
        let json = serde_json::to_string(&sent).unwrap();
        let received: RingOwnership = serde_json::from_str(&json).unwrap();
        assert_eq!(received, sent, "ring of port {port}: {json:.200}");
    }
}

#[test]
fn worker_models_are_optional_fields_older_frames_lack() {
    let plain = serde_json::to_value(worker("gpu-0", 1, true)).unwrap();
    assert!(plain.get("models").is_none(), "{plain}");
    assert!(plain.get("reported_models").is_none(), "{plain}");
    let back: WorkerRecord = serde_json::from_value(plain).unwrap();
    assert!(back.models.is_empty() && back.reported_models.is_none());
    let record = WorkerRecord {
        models: vec!["alpha".into(), "beta".into()],
        reported_models: Some(vec!["alpha".into()]),
        ..worker("gpu-1", 1, true)
    };
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["models"], serde_json::json!(["alpha", "beta"]));
    assert_eq!(json["reported_models"], serde_json::json!(["alpha"]));
    assert_eq!(
        serde_json::from_value::<WorkerRecord>(json).unwrap(),
        record
    );
}
