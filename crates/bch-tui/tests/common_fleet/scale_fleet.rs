//! Synthetic fleets of any size (16, 1,000, 10,000 workers), built through the front door (a
//! snapshot frame and ticks, as the gateway sends them), shared by the large-fleet snapshots and
//! the drawing benchmark.

use bch_core::telemetry::{
    RingOwnership, RingShare, ServerFrame, ServerMessage, Snapshot, Tick, Totals, WorkerRecord,
    WorkerState,
};
use bch_tui::{ConnEvent, ConnStatus, ReplicaId, State};

/// Gateway time of the snapshot, ms since the Unix epoch.
const T0: u64 = 1_767_268_800_000;

/// The name of the `i`-th worker of a scale fleet: `gpu-00042`.
pub fn worker_name(i: usize) -> String {
    format!("gpu-{i:05}")
}

/// Position of the single hottest worker in a fleet of `n` (two thirds down, so it starts out of
/// view in configuration order).
pub fn hottest(n: usize) -> usize {
    n * 2 / 3
}

/// The load (in-flight requests) of the hottest worker; every other worker has less.
pub const HOTTEST_LOAD: u64 = 64;

/// Worker `i` of `n`: loads spread over 0..=12 (a few over the bound), one unhealthy worker in
/// 97, one draining in 101, and the hottest one at [`HOTTEST_LOAD`].
fn worker(i: usize, n: usize) -> WorkerRecord {
    let active = if i == hottest(n) {
        HOTTEST_LOAD
    } else {
        ((i * 7_919) % 13) as u64
    };
    WorkerRecord {
        name: worker_name(i),
        ring_id: None,
        url: format!(
            "http://10.{}.{}.{}:30000",
            i / 65_536,
            (i / 256) % 256,
            i % 256
        ),
        healthy: i % 97 != 5,
        state: if i % 101 == 7 {
            WorkerState::Draining.into()
        } else {
            WorkerState::Active.into()
        },
        active,
        requests_total: 1_000 + i as u64 * 37,
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
    }
}

/// The snapshot of a fleet of `n` workers: every worker owns one equal arc of the ring.
fn snapshot(n: usize) -> ServerFrame {
    let ring = RingOwnership {
        virtual_nodes: 150,
        workers: (0..n)
            .map(|i| RingShare {
                name: worker_name(i),
                share: 1.0 / n as f64,
                arcs: vec![[i as f64 / n as f64, (i + 1) as f64 / n as f64]],
            })
            .collect(),
    };
    ServerFrame::new(
        0,
        ServerMessage::Snapshot(Snapshot {
            ts_ms: T0,
            policy: Default::default(),
            workers: (0..n).map(|i| worker(i, n)).collect(),
            ring: Some(ring),
            keys: Vec::new(),
            spills: Vec::new(),
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

/// A console connected to one gateway that sent the snapshot of a fleet of `n` workers and then
/// 40 ticks, each changing one worker's load.
pub fn fleet(n: usize) -> State {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(0), snapshot(n));
    for seq in 1..=40u64 {
        // Any worker but the hottest, one more request in flight (still below the hottest).
        let i = (seq as usize * 31) % n;
        let i = if i == hottest(n) { (i + 1) % n } else { i };
        let mut changed = worker(i, n);
        changed.active = (changed.active + 1) % 13;
        let tick = Tick {
            ts_ms: T0 + seq * 100,
            workers: vec![changed],
            keys: vec![],
            removed_keys: vec![],
            spills: vec![],
            totals: Totals {
                requests_per_s: 600.0 + (seq % 20) as f64 * 25.0,
                spills_per_s: 0.5,
                requests_total: 1_000_000 + seq * 80,
                spills_total: 4_321 + seq,
            },
            dropped_events: 0,
            discovery: None,
            admission: None,
        };
        let resync = s.apply_replica_frame(
            ReplicaId(0),
            ServerFrame::new(seq, ServerMessage::Tick(tick)),
        );
        assert_eq!(resync, None, "the ticks follow the snapshot without a gap");
    }
    s
}
