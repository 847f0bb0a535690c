//! The pool selector: a fleet serving two models, seen whole or one pool at a time. A pool's
//! workers panel, ring, keys and OVER marks are what a console watching a one-model gateway over
//! the pool's workers shows, and OVER is bch-core's rule over the pool's loads (a property test).
//! The choice survives pausing and a replay's seeks; the header names the model, and threshold
//! changes say they apply to every pool.

mod common;

use bch_core::policy::{FleetLoad, PolicySettings};
use bch_core::recording::{RecordedEvent, RecordedKind, Recording, RecordingHeader};
use bch_core::ring::Ring;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::telemetry::{
    RingOwnership, ServerFrame, ServerMessage, Snapshot, WorkerRecord, WorkerState,
};
use bch_tui::{
    Action, ConnEvent, ConnStatus, Effect, MAX_WORKER_MODELS, OverRule, Replay, ReplicaId, State,
};
use common::{connected_with, frame, render, snapshot_with};
use insta::assert_snapshot;
use proptest::prelude::*;
use tokio::time::Instant;

const LLAMA: &str = "llama-3.1-8b-instruct";
const QWEN: &str = "qwen-2.5-7b";

/// The recorded fleet (w0–w3) serving two models: w0 and w1 `llama`, w2 and w3 `qwen`, w1 both.
/// Loads: llama's pool (w0 9, w1 3) has its own minimum 3, qwen's (w1 3, w2 0, w3 1) its own 0.
fn two_models(snap: &mut Snapshot) {
    let models: [&[&str]; 4] = [&[LLAMA], &[LLAMA, QWEN], &[QWEN], &[QWEN]];
    let loads = [9, 3, 0, 1];
    for ((worker, models), load) in snap.workers.iter_mut().zip(models).zip(loads) {
        worker.models = models.iter().map(|m| (*m).to_owned()).collect();
        worker.active = load;
    }
}

fn two_model_console() -> State {
    connected_with(two_models)
}

fn names(workers: &[WorkerRecord]) -> Vec<&str> {
    workers.iter().map(|w| w.name.as_str()).collect()
}

#[test]
fn m_cycles_every_worker_then_each_model_by_name_then_every_worker() {
    let mut s = two_model_console();
    assert_eq!(s.live().models(), [LLAMA, QWEN]);
    let mut seen = vec![s.pool().map(str::to_owned)];
    for _ in 0..3 {
        assert_eq!(s.apply_action(Action::CyclePool), Effect::None);
        seen.push(s.pool().map(str::to_owned));
    }
    assert_eq!(
        seen,
        [None, Some(LLAMA.into()), Some(QWEN.into()), None],
        "all → llama → qwen → all"
    );
    assert_eq!(s.visible().workers.len(), 4);

    // A fleet without models has one pool: `m` says so and shows every worker.
    let mut plain = connected_with(|_| {});
    plain.apply_action(Action::CyclePool);
    assert_eq!(plain.pool(), None);
    assert!(plain.notice().unwrap().contains("no model declared"));
}

#[test]
fn a_pool_shows_its_workers_its_ring_and_the_keys_and_spills_of_its_workers() {
    let mut s = two_model_console();
    s.set_pool(Some(QWEN.into()));
    let pool = s.visible();
    assert_eq!(pool.pool.as_deref(), Some(QWEN));
    assert_eq!(names(&pool.workers), ["w1", "w2", "w3"]);
    // The ring the gateway routes qwen on: bch-core's ring over the pool's ring identities, in
    // configuration order.
    let identities: Vec<&str> = pool.workers.iter().map(|w| w.url.as_str()).collect();
    let expected = RingOwnership::of_ring(&Ring::build(&identities, 150), &["w1", "w2", "w3"]);
    assert_eq!(pool.ring.as_deref(), Some(&expected));
    let shares: f64 = expected.workers.iter().map(|w| w.share).sum();
    assert!((shares - 1.0).abs() < 1e-4);
    // Every position of the pool's ring is owned by a pool worker.
    for i in 0..100 {
        assert!(pool.owner_at(i as f64 / 100.0).is_some());
    }
    let members = ["w1", "w2", "w3"];
    let whole = s.whole();
    assert!(!pool.keys.is_empty() && pool.keys.len() < whole.keys.len());
    for key in whole.keys.values() {
        let in_pool =
            members.contains(&key.preferred.as_str()) || members.contains(&key.current.as_str());
        assert_eq!(pool.keys.contains_key(&key.key), in_pool, "{}", key.key);
    }
    for spill in &pool.spills {
        assert!(members.contains(&spill.from.as_str()) || members.contains(&spill.to.as_str()));
    }
    // The key table and the scroll limits read the pool's picture.
    assert_eq!(s.key_rows().len(), pool.keys.len());
    assert_eq!(
        names(&s.worker_rows().into_iter().cloned().collect::<Vec<_>>()),
        members
    );

    // A model no worker serves: an empty pool, not an error.
    s.set_pool(Some("mistral".into()));
    assert!(s.visible().workers.is_empty());
    assert!(s.visible().ring.is_none());
}

#[test]
fn over_is_by_the_pool_bound_not_the_fleets() {
    let mut s = two_model_console();
    // The whole fleet has no one bound: each worker is OVER by its pool's.
    assert!(s.visible().bound().is_none());
    let OverRule::PerPool(bounds) = s.visible().over_rule() else {
        panic!("two pools, two bounds");
    };
    assert_eq!(bounds.len(), 2);
    // llama: min 3, mean 6: w0 at 9 is over `min + 2 = 5` and `mean × 1.5 = 9`? 9 > 9 is not,
    // so w0 stays; qwen: min 0, mean 1.33: w1 at 3 is over 2 and 2.0, so OVER.
    let over: Vec<&str> = (s.visible().workers.iter())
        .filter(|w| s.visible().over_rule().over(w))
        .map(|w| w.name.as_str())
        .collect();
    assert_eq!(
        over,
        ["w1"],
        "w1 is over in qwen's pool, which it serves too"
    );
    // One bound over the whole fleet (min 0, mean 3.25) would have marked w0 instead.
    let policy = s.live().policy.unwrap();
    let fleet_wide = FleetLoad::of([9, 3, 0, 1]).unwrap();
    assert!(fleet_wide.bound_for(9, &policy).should_spill());

    s.set_pool(Some(LLAMA.into()));
    let bound = s.visible().bound().unwrap();
    assert_eq!((bound.load().min_load, bound.load().mean_load), (3, 6.0));
    assert_eq!(s.visible().over(), 0, "in llama's pool w1 is the minimum");
    s.set_pool(Some(QWEN.into()));
    let bound = s.visible().bound().unwrap();
    assert_eq!(bound.load().min_load, 0);
    assert_eq!(s.visible().over(), 1);
}

/// A console over `workers` as a gateway without models would send them, under `policy`: the
/// one-model view a pool's view must equal.
fn one_model_console(mut workers: Vec<WorkerRecord>, policy: &PolicySettings) -> State {
    for worker in &mut workers {
        worker.models.clear();
    }
    connected_with(|snap| {
        snap.workers = workers;
        snap.ring = None;
        snap.policy.min_load_gap = policy.min_load_gap;
        snap.policy.max_load_skew = policy.max_load_skew;
    })
}

/// A fleet of `loads.len()` workers; worker `i` serves the models whose bit is set in
/// `models[i]` (at least one: a fleet with models declares them on every worker), with
/// `loads[i]` in flight, healthy and active per `up[i]`.
fn fleet(loads: &[u64], models: &[u8], up: &[(bool, bool)]) -> Vec<WorkerRecord> {
    let template = match frame("snapshot").message {
        ServerMessage::Snapshot(snap) => snap.workers[0].clone(),
        other => panic!("{other:?}"),
    };
    (0..loads.len())
        .map(|i| {
            let mut worker = template.clone();
            worker.name = format!("w{i}");
            worker.url = format!("http://10.0.0.{i}:8000");
            worker.active = loads[i];
            worker.healthy = up[i].0;
            worker.state = if up[i].1 {
                WorkerState::Active
            } else {
                WorkerState::Draining
            }
            .into();
            let bits = models[i].max(1);
            worker.models = (["a", "b", "c"].iter().enumerate())
                .filter(|(m, _)| bits & (1 << m) != 0)
                .map(|(_, name)| (*name).to_owned())
                .collect();
            worker
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Per pool: OVER is bch-core's rule over the pool's routable loads, the ring is the one
    /// bch-core's router routes the pool on, and the pool's workers, ring and OVER marks are
    /// those of a one-model console over the pool's workers. The whole fleet's view marks a
    /// worker OVER when one of its pools' rules does.
    #[test]
    fn a_pool_is_a_one_model_fleet_over_its_workers(
        fleet_spec in (2usize..9).prop_flat_map(|n| (
            proptest::collection::vec(0u64..14, n),
            proptest::collection::vec(1u8..8, n),
            proptest::collection::vec((proptest::bool::weighted(0.85), proptest::bool::weighted(0.85)), n),
        )),
        gap in 0u64..4,
        skew in 100u32..250,
    ) {
        let (loads, models, up) = fleet_spec;
        let workers = fleet(&loads, &models, &up);
        let skew = f64::from(skew) / 100.0;
        let edit = |snap: &mut Snapshot| {
            snap.workers = workers.clone();
            snap.ring = None;
            snap.policy.min_load_gap = gap;
            snap.policy.max_load_skew = skew;
        };
        let mut s = connected_with(edit);
        let policy: PolicySettings = s.live().policy.unwrap();
        let whole_rule = s.visible().over_rule();
        // The gateway's router over the same membership: its pools' rings.
        let specs = (workers.iter())
            .map(|w| WorkerSpec {
                name: w.name.clone(),
                url: w.url.clone(),
                ring_id: None,
                source: WorkerSource::Static,
                max_in_flight: None,
                models: w.models.clone(),
            })
            .collect();
        let router = Router::new(specs, policy).unwrap();
        let table = router.table();
        for model in s.live().models().into_iter().map(str::to_owned).collect::<Vec<_>>() {
            s.set_pool(Some(model.clone()));
            let pool = s.visible();
            let members: Vec<WorkerRecord> = (workers.iter())
                .filter(|w| w.models.contains(&model))
                .cloned()
                .collect();
            prop_assert_eq!(names(&pool.workers), names(&members));
            let routable = |w: &WorkerRecord| w.healthy && w.state == WorkerState::Active;
            let load = FleetLoad::of(members.iter().filter(|w| routable(w)).map(|w| w.active));
            let alone = one_model_console(members.clone(), &policy);
            let alone_rule = alone.visible().over_rule();
            let rule = pool.over_rule();
            for worker in &pool.workers {
                let core = routable(worker)
                    && load.is_some_and(|l| l.bound_for(worker.active, &policy).should_spill());
                prop_assert_eq!(rule.over(worker), core, "{} in {}", worker.name, model);
                prop_assert_eq!(alone_rule.over(worker), core);
                if core {
                    prop_assert!(whole_rule.over(worker), "{} is OVER in {}", worker.name, model);
                }
            }
            let pool_ring = pool.ring.as_deref().map(|r| r.workers.clone());
            let alone_ring = alone.visible().ring.as_deref().map(|r| r.workers.clone());
            prop_assert_eq!(&pool_ring, &alone_ring);
            let routed = table.pool(table.pool_of_model(&model).unwrap()).unwrap();
            let routed_names: Vec<&str> = (routed.workers().iter())
                .map(|&w| table.workers()[w].spec.name.as_str())
                .collect();
            prop_assert_eq!(&routed_names, &names(&members));
            let gateway_ring = RingOwnership::of_ring(routed.ring(), &routed_names);
            prop_assert_eq!(pool_ring, Some(gateway_ring.workers));
        }
        // And nothing is OVER in the whole view that no pool's rule marks.
        s.set_pool(None);
        for worker in &s.visible().workers {
            let in_some_pool = worker.models.iter().any(|model| {
                let pool: Vec<u64> = (workers.iter())
                    .filter(|w| w.models.contains(model) && w.healthy && w.state == WorkerState::Active)
                    .map(|w| w.active)
                    .collect();
                FleetLoad::of(pool).is_some_and(|l| l.bound_for(worker.active, &policy).should_spill())
            });
            let routable = worker.healthy && worker.state == WorkerState::Active;
            prop_assert_eq!(whole_rule.over(worker), routable && in_some_pool, "{}", worker.name);
        }
    }
}

#[test]
fn a_paused_pool_stays_frozen_and_follows_the_fleet_again_after() {
    let mut s = two_model_console();
    s.set_pool(Some(QWEN.into()));
    s.apply_action(Action::TogglePause);
    let mut tick = frame("tick_spill");
    tick.seq = 1;
    if let ServerMessage::Tick(ref mut t) = tick.message {
        t.workers.retain(|w| w.name == "w1");
        t.workers[0].active = 7;
        t.workers[0].models = vec![LLAMA.into(), QWEN.into()];
    }
    s.apply_replica_frame(ReplicaId(0), tick);
    let w1 = |s: &State| {
        s.visible()
            .workers
            .iter()
            .find(|w| w.name == "w1")
            .unwrap()
            .active
    };
    assert_eq!(w1(&s), 3, "paused: the pool shows the frozen fleet");
    s.apply_action(Action::TogglePause);
    assert_eq!(w1(&s), 7);
    // The warnings read the whole fleet: a pool's view hides nothing wrong elsewhere.
    assert_eq!(s.whole().workers.len(), 4);
}

#[test]
fn worker_models_are_capped() {
    let s = connected_with(|snap| {
        snap.workers[0].models = (0..1_000).map(|i| format!("m{i}")).collect();
        snap.workers[0].models.push("x".repeat(10_000));
    });
    let models = &s.live().workers[0].models;
    assert_eq!(models.len(), MAX_WORKER_MODELS);
}

/// The two-model fleet watching qwen's pool, picked with `m` twice.
fn watching_qwen() -> State {
    let mut s = two_model_console();
    s.apply_action(Action::CyclePool);
    s.apply_action(Action::CyclePool);
    assert_eq!(s.pool(), Some(QWEN));
    s
}

#[test]
fn a_pool_at_every_size() {
    let now = Instant::now();
    let s = watching_qwen();
    for (width, height) in [(80, 24), (120, 40), (200, 50)] {
        let screen = render(&s, width, height, now);
        assert_eq!(screen.lines().count(), usize::from(height));
        assert!(screen.lines().next().unwrap().contains("model qwen-2.5-7b"));
        assert!(
            screen.contains("all pools"),
            "the hints say the thresholds are every pool's"
        );
        assert_snapshot!(format!("qwen_pool_{width}x{height}"), screen);
    }
}

#[test]
fn every_worker_of_two_models_at_80x24() {
    let screen = render(&two_model_console(), 80, 24, Instant::now());
    assert!(screen.lines().next().unwrap().contains("all 2 models"));
    assert_snapshot!("two_models_whole_80x24", screen);
}

#[test]
fn a_threshold_change_in_a_pool_says_it_applies_to_every_pool() {
    let mut s = watching_qwen();
    assert!(matches!(s.apply_action(Action::GapUp), Effect::Send(_)));
    let screen = render(&s, 80, 24, Instant::now());
    let message = screen.lines().nth(3).unwrap();
    assert!(message.contains("gap 2 → 3 (all pools)"), "{message}");
}

#[test]
fn a_long_or_hostile_model_name_is_cut_and_made_printable_in_the_header() {
    let hostile = format!("evil\u{1b}[2J{}", "x".repeat(200));
    let mut s = connected_with(|snap| {
        two_models(snap);
        snap.workers[3].models = vec![hostile.clone()];
    });
    s.set_pool(Some(hostile));
    let screen = render(&s, 80, 24, Instant::now());
    let first = screen.lines().next().unwrap();
    assert!(!first.contains('\u{1b}'));
    assert!(first.contains("model evil"), "{first}");
    assert!(first.contains('…'), "{first}");
}

/// A recording of the two-model fleet: a snapshot, then ticks moving w2's load.
fn recording() -> Recording {
    const START_MS: u64 = 1_767_268_800_000;
    let event = |at_ms, kind| RecordedEvent {
        at_ms,
        replica: 0,
        kind,
    };
    let framed = |frame: ServerFrame| RecordedKind::Frame {
        frame: Box::new(frame),
    };
    let mut events = vec![
        event(START_MS, RecordedKind::Connected),
        event(START_MS + 5, framed(snapshot_with(two_models))),
    ];
    for seq in 1..=40u64 {
        let mut tick = frame("tick_unhealthy");
        tick.seq = seq;
        if let ServerMessage::Tick(ref mut t) = tick.message {
            t.ts_ms = START_MS + seq * 500;
            t.workers.clear();
            t.spills.clear();
            t.keys.clear();
        }
        events.push(event(START_MS + seq * 500, framed(tick)));
    }
    Recording {
        header: RecordingHeader::new("gatewayd", START_MS, vec!["ws://gw/ws".into()]),
        events,
        damaged: Vec::new(),
        truncated: false,
    }
}

#[test]
fn the_selector_works_in_a_replay_and_survives_a_seek_back() {
    let mut replay = Replay::new(recording(), Instant::now());
    let start = replay.start_ms();
    replay.seek(start + 10_000);
    replay.state_mut().apply_action(Action::CyclePool);
    assert_eq!(replay.state().pool(), Some(LLAMA));
    assert_eq!(names(&replay.state().visible().workers), ["w0", "w1"]);
    replay.seek(start + 1_000);
    assert_eq!(
        replay.state().pool(),
        Some(LLAMA),
        "a seek back keeps the pool"
    );
    assert_eq!(names(&replay.state().visible().workers), ["w0", "w1"]);
    replay.seek(start + 15_000);
    assert_eq!(names(&replay.state().visible().workers), ["w0", "w1"]);
    // `--model` before the first event: the pool is there from the snapshot on.
    let mut replay = Replay::new(recording(), Instant::now());
    replay.state_mut().set_pool(Some(QWEN.into()));
    replay.seek(start + 2_000);
    assert_eq!(names(&replay.state().visible().workers), ["w1", "w2", "w3"]);
    let state = replay.state_mut();
    state.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    assert_eq!(state.visible().pool.as_deref(), Some(QWEN));
}

/// `--model` naming a model no worker serves: the workers panel says so and names the models
/// the fleet has, instead of a bare `no workers`.
#[test]
fn a_model_no_worker_serves_says_so_and_names_the_models_there_are() {
    let mut s = two_model_console();
    s.set_pool(Some("nosuch".into()));
    assert!(s.visible().workers.is_empty());
    let screen = render(&s, 120, 40, Instant::now());
    assert!(
        screen.contains(&format!("no worker serves nosuch; models: {LLAMA}, {QWEN}")),
        "{screen}"
    );
    // Before the fleet is known there is nothing to name yet.
    let mut waiting = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    waiting.set_pool(Some("nosuch".into()));
    let screen = render(&waiting, 120, 40, Instant::now());
    assert!(screen.contains("no worker serves nosuch (yet)"), "{screen}");
}
