//! Protocol version 2's two promises: a client rebuilding the ring from worker records gets the
//! gateway's ring ownership exactly, and membership deltas applied in order reach the worker list
//! a fresh snapshot would carry.

use bch_core::policy::PolicySettings;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::telemetry::{MembershipUpdate, RingOwnership, WorkerRecord};
use proptest::prelude::*;

fn spec(index: usize, ring_id: bool) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{index}"),
        url: format!("http://10.0.{}.{}:8000", index / 250, index % 250),
        ring_id: ring_id.then(|| format!("rack-{index}")),
        source: WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    }
}

fn record(name: usize, url_version: u8) -> WorkerRecord {
    WorkerRecord {
        name: format!("w{name}"),
        url: format!("http://10.0.0.{name}:{}", 8000 + u16::from(url_version)),
        ring_id: None,
        healthy: true,
        state: Default::default(),
        active: 0,
        requests_total: 0,
        spilled_in_total: 0,
        spilled_out_total: 0,
        errors_total: 0,
        load: Some(0),
        reported_load: None,
        scrape_age_ms: None,
        load_stale: false,
        source: WorkerSource::Static.into(),
        capacity: None,
        full: false,
        probe_failure: None,
        models: Vec::new(),
        reported_models: None,
    }
}

/// Worker lists over names 0..24, each name once, in a random order, with one of two URLs.
fn worker_list() -> impl Strategy<Value = Vec<WorkerRecord>> {
    proptest::collection::vec((0usize..24, 0u8..2), 0..24).prop_map(|picks| {
        let mut seen = std::collections::HashSet::new();
        picks
            .into_iter()
            .filter(|(name, _)| seen.insert(*name))
            .map(|(name, url)| record(name, url))
            .collect()
    })
}

/// An edit of `before` as membership changes make them: some leave, some change URL, some arrive
/// at any position; the others keep their order.
fn edited(
    before: Vec<WorkerRecord>,
) -> impl Strategy<Value = (Vec<WorkerRecord>, Vec<WorkerRecord>)> {
    let n = before.len();
    (
        proptest::collection::vec(0u8..4, n),
        proptest::collection::vec((0usize..25, 24usize..40), 0..5),
    )
        .prop_map(move |(fates, arrivals)| {
            let mut after: Vec<WorkerRecord> = before
                .iter()
                .zip(&fates)
                .filter(|(_, fate)| **fate != 0)
                .map(|(w, fate)| {
                    let mut w = w.clone();
                    if *fate == 1 {
                        w.url.push_str("/moved");
                    }
                    w
                })
                .collect();
            let mut seen = std::collections::HashSet::new();
            for (position, name) in arrivals {
                if seen.insert(name) {
                    after.insert(position.min(after.len()), record(name, 0));
                }
            }
            (before.clone(), after)
        })
}

fn assert_delta_reaches(before: &[WorkerRecord], after: &[WorkerRecord]) {
    let delta = MembershipUpdate::between(1, before, after, 150);
    // Through the wire, as a client gets it.
    let json = serde_json::to_string(&delta).unwrap();
    let delta: MembershipUpdate = serde_json::from_str(&json).unwrap();
    let mut list = before.to_vec();
    assert!(delta.apply_to(&mut list), "the count matches");
    assert_eq!(list, after);
    // Applied again (a snapshot taken after the change, then the delta): no change.
    assert!(delta.apply_to(&mut list));
    assert_eq!(list, after);
}

proptest! {
    #[test]
    fn deltas_of_edits_reach_the_new_list(
        (before, after) in worker_list().prop_flat_map(edited)
    ) {
        assert_delta_reaches(&before, &after);
        // An edit sends only what changed: never more records than arrived or changed.
        let delta = MembershipUpdate::between(1, &before, &after, 150);
        prop_assert!(delta.added.len() + delta.changed.len() <= after.len());
    }

    #[test]
    fn deltas_between_any_two_lists_reach_the_new_one(
        before in worker_list(),
        after in worker_list(),
    ) {
        assert_delta_reaches(&before, &after);
    }

    #[test]
    fn ring_from_records_is_the_gateways_ring(
        flags in proptest::collection::vec(any::<bool>(), 1..40),
        virtual_nodes in 1u32..64,
    ) {
        let specs: Vec<WorkerSpec> =
            flags.iter().enumerate().map(|(i, &ring_id)| spec(i, ring_id)).collect();
        let policy = PolicySettings { virtual_nodes, ..PolicySettings::default() };
        let router = Router::new(specs, policy).unwrap();
        let table = router.table();
        let names: Vec<&str> = table.workers().iter().map(|w| w.spec.name.as_str()).collect();
        let gateways = RingOwnership::of_ring(table.ring(), &names);
        let records = table.worker_records(0);
        prop_assert_eq!(RingOwnership::of_workers(&records, virtual_nodes), gateways);
    }
}

#[test]
fn a_delta_for_one_arrival_carries_one_record() {
    let before: Vec<WorkerRecord> = (0..1_000).map(|i| record(i, 0)).collect();
    let mut after = before.clone();
    after.insert(500, record(5_000, 0));
    let delta = MembershipUpdate::between(1, &before, &after, 150);
    assert_eq!(delta.added.len(), 1);
    assert_eq!(delta.added[0].index, 500);
    assert!(delta.removed.is_empty() && delta.changed.is_empty());
    assert_delta_reaches(&before, &after);
}

#[test]
fn a_delta_applied_to_the_wrong_list_says_so() {
    let before: Vec<WorkerRecord> = (0..3).map(|i| record(i, 0)).collect();
    let after: Vec<WorkerRecord> = (0..4).map(|i| record(i, 0)).collect();
    let delta = MembershipUpdate::between(1, &before, &after, 150);
    let mut missed_a_worker = before[..2].to_vec();
    assert!(!delta.apply_to(&mut missed_a_worker));
}
