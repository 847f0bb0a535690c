//! A ring derived from the previous one by a membership change ([`Ring::rebuilt`]) is the ring a
//! full build of the new list gives: same points, owners, per-worker groups and seeds, so the same
//! owner, walk and spill orders for every key, over random sequences of joins, departures and
//! reorders (ring ids that are URLs or `ring_id` overrides alike).

use bch_core::ring::{Ring, hash_position};
use proptest::prelude::*;

/// One membership change.
#[derive(Debug, Clone)]
enum Change {
    /// A new worker joins at this index (taken modulo the list length + 1).
    Join(usize),
    /// The worker at this index (modulo the length) leaves.
    Leave(usize),
    /// Two workers swap places in configuration order.
    Swap(usize, usize),
    /// Several workers join at the end at once (a DNS answer).
    JoinMany(u8),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => any::<usize>().prop_map(Change::Join),
        3 => any::<usize>().prop_map(Change::Leave),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Change::Swap(a, b)),
        1 => (1u8..6).prop_map(Change::JoinMany),
    ]
}

/// A fresh ring id: a URL, or every third one a `ring_id` override.
fn fresh_id(serial: &mut u32) -> String {
    *serial += 1;
    if serial.is_multiple_of(3) {
        format!("replica-{serial}")
    } else {
        format!("http://10.0.{}.{}:8000", *serial / 250, *serial % 250)
    }
}

fn apply(ids: &mut Vec<String>, change: &Change, serial: &mut u32) {
    match *change {
        Change::Join(at) => {
            let at = at % (ids.len() + 1);
            ids.insert(at, fresh_id(serial));
        }
        Change::Leave(at) if !ids.is_empty() => {
            ids.remove(at % ids.len());
        }
        Change::Swap(a, b) if !ids.is_empty() => {
            let n = ids.len();
            ids.swap(a % n, b % n);
        }
        Change::JoinMany(count) => {
            for _ in 0..count {
                ids.push(fresh_id(serial));
            }
        }
        _ => {}
    }
}

/// The routing helpers agree too (they read only the compared fields, but a future field that
/// the incremental path forgets would show here first).
fn same_answers(incremental: &Ring, full: &Ring, keys: &[u64]) {
    for &position in keys {
        assert_eq!(incremental.owner(position), full.owner(position));
        assert_eq!(
            incremental.workers_from(position),
            full.workers_from(position)
        );
        assert_eq!(
            incremental.seeded_order(position),
            full.seeded_order(position)
        );
        for set in [0b1u64, 0b1010, u64::MAX, 0xF0F0] {
            assert_eq!(
                incremental.first_in_set(position, set),
                full.first_in_set(position, set)
            );
            assert_eq!(
                incremental.first_seeded_in_set(position, set),
                full.first_seeded_in_set(position, set)
            );
        }
        assert_eq!(
            incremental.first_seeded(position, |w| w % 2 == 0),
            full.first_seeded(position, |w| w % 2 == 0)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn incremental_rebuild_equals_full_build(
        start in 0usize..12,
        virtual_nodes in prop_oneof![Just(1u32), Just(3), Just(40)],
        changes in prop::collection::vec(change(), 1..16),
        keys in prop::collection::vec(any::<u64>(), 4),
    ) {
        let mut serial = 0;
        let mut ids: Vec<String> = (0..start).map(|_| fresh_id(&mut serial)).collect();
        let mut ring = Ring::build(&ids, virtual_nodes);
        for change in &changes {
            let previous = ids.clone();
            apply(&mut ids, change, &mut serial);
            let incremental = ring.rebuilt(&previous, &ids);
            let full = Ring::build(&ids, virtual_nodes);
            prop_assert_eq!(&incremental, &full, "after {:?}", change);
            same_answers(&incremental, &full, &keys);
            ring = incremental;
        }
    }
}

#[test]
fn rebuild_to_and_from_empty() {
    let ids = ["http://a:1", "http://b:1", "c"];
    let empty = Ring::build::<&str>(&[], 150);
    let full = empty.rebuilt::<&str, _>(&[], &ids);
    assert_eq!(full, Ring::build(&ids, 150));
    let gone = full.rebuilt(&ids, &[] as &[&str]);
    assert!(gone.is_empty());
    assert_eq!(gone, empty);
    assert_eq!(
        full.owner(hash_position(b"k")),
        Ring::build(&ids, 150).owner(hash_position(b"k"))
    );
}
