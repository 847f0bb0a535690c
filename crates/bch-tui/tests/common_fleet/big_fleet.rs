//! A synthetic fleet at the scale the console must handle (64 workers, 256 tracked keys, a full
//! rate history), shared by the screen snapshots and the drawing benchmark.

use std::collections::BTreeMap;

use bch_core::policy::Branch;
use bch_core::telemetry::{
    KeyKind, KeyRecord, RingOwnership, RingShare, ServerFrame, ServerMessage, Snapshot, SpillEvent,
    Tick, Totals, WorkerRecord, WorkerState,
};
use bch_tui::{ConnEvent, ConnStatus, ReplicaId, State};

/// A synthetic fleet at the scale the console must handle: 64 workers and 256 tracked keys.
fn big_fleet() -> ServerFrame {
    const T0: u64 = 1_767_268_800_000;
    let n = 64usize;
    let workers: Vec<WorkerRecord> = (0..n)
        .map(|i| WorkerRecord {
            name: format!("gpu-{i:02}"),
            url: format!("http://10.1.0.{}:30000", 10 + i),
            ring_id: None,
            healthy: i % 17 != 5,
            state: WorkerState::Active.into(),
            active: ((i * 7) % 11) as u64 + if i == 3 { 20 } else { 0 },
            requests_total: 1000 + i as u64 * 37,
            spilled_in_total: (i % 5) as u64,
            spilled_out_total: (i % 3) as u64,
            errors_total: 0,
            load: None,
            reported_load: None,
            scrape_age_ms: None,
            load_stale: false,
            source: Default::default(),
            capacity: None,
            full: false,
            probe_failure: None,
            models: Vec::new(),
            reported_models: None,
        })
        .collect();
    // Interleaved arcs: worker i owns [(k*n+i)/(n*8), (k*n+i+1)/(n*8)) for k in 0..8.
    let points = (n * 8) as f64;
    let ring = RingOwnership {
        virtual_nodes: 150,
        workers: (0..n)
            .map(|i| RingShare {
                name: format!("gpu-{i:02}"),
                share: 1.0 / n as f64,
                arcs: (0..8)
                    .map(|k| {
                        let s = (k * n + i) as f64 / points;
                        [s, s + 1.0 / points]
                    })
                    .collect(),
            })
            .collect(),
    };
    let keys: Vec<KeyRecord> = (0..256u64)
        .map(|k| {
            let pref = format!("gpu-{:02}", k % 64);
            let spilled = k % 9 == 0;
            let cur = if spilled {
                format!("gpu-{:02}", (k + 1) % 64)
            } else {
                pref.clone()
            };
            KeyRecord {
                key: format!("tenant-{:03}/session-{k:04}", k % 40),
                kind: KeyKind::Explicit.into(),
                active: BTreeMap::from([(cur.clone(), k % 4)]),
                preferred: pref,
                current: cur,
                requests_total: 10 + k * 3,
                spills_total: if spilled { 1 + k % 5 } else { 0 },
                last_seen_ms: T0 - k * 10,
            }
        })
        .collect();
    let spills: Vec<SpillEvent> = (0..40u64)
        .map(|i| SpillEvent {
            ts_ms: T0 - 4000 + i * 100,
            key: format!("tenant-{:03}/session-{:04}", i % 40, i * 9),
            branch: Branch::ExplicitRoutingKeySpillover.into(),
            from: "gpu-03".into(),
            to: format!("gpu-{:02}", 4 + i % 3),
            preferred_load: 21 + i % 3,
            min_load: 0,
            mean_load: 5.3,
            min_load_gap: 2,
            max_load_skew: 1.5,
            load_signal: Default::default(),
            cause: Default::default(),
        })
        .collect();
    ServerFrame::new(
        0,
        ServerMessage::Snapshot(Snapshot {
            ts_ms: T0,
            policy: Default::default(),
            workers,
            ring: Some(ring),
            keys,
            spills,
            totals: Totals {
                requests_per_s: 850.0,
                spills_per_s: 12.5,
                requests_total: 1_000_000,
                spills_total: 4_321,
            },
            discovery: Vec::new(),
            admission: None,
            read_only: false,
        }),
    )
}

pub fn big() -> State {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(0), big_fleet());
    for seq in 1..=160u64 {
        let tick = Tick {
            ts_ms: 1_767_268_800_000 + seq * 100,
            workers: vec![],
            keys: vec![],
            removed_keys: vec![],
            spills: vec![],
            totals: Totals {
                requests_per_s: 600.0 + (seq % 20) as f64 * 25.0,
                spills_per_s: if seq % 10 < 3 { 15.0 } else { 0.5 },
                requests_total: 1_000_000 + seq * 80,
                spills_total: 4_321 + seq,
            },
            dropped_events: 0,
            discovery: None,
            admission: None,
        };
        assert_eq!(
            s.apply_replica_frame(
                ReplicaId(0),
                ServerFrame::new(seq, ServerMessage::Tick(tick))
            ),
            None
        );
    }
    s
}
