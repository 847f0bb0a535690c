//! Unit tests of the policy settings, the bound and the branch names.

use super::*;

#[test]
fn validation_names_the_field() {
    let base = PolicySettings::default();
    for bad in [0.99, f64::NAN, f64::INFINITY, -1.0] {
        let err = base
            .patched(&PolicyPatch {
                max_load_skew: Some(bad),
                ..Default::default()
            })
            .unwrap_err();
        assert!(err.to_string().contains("max_load_skew"), "{err}");
    }
    let err = base
        .patched(&PolicyPatch {
            virtual_nodes: Some(0),
            ..Default::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("virtual_nodes"));
    let ok = base
        .patched(&PolicyPatch {
            min_load_gap: Some(0),
            max_load_skew: Some(1.0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((ok.min_load_gap, ok.max_load_skew), (0, 1.0));
    assert_eq!(ok.kind, base.kind);
}

#[test]
fn near_idle_rule() {
    // Loads [p,0,0,0]: mean = p/4; with gap 2 and skew 1.5, p <= 2 stays and p = 3 spills.
    for (p, gap, spill) in [
        (0, 2, false),
        (1, 2, false),
        (2, 2, false),
        (3, 2, true),
        (1, 0, true),
    ] {
        let check = BoundCheck {
            preferred_load: p,
            min_load: 0,
            mean_load: p as f64 / 4.0,
            min_load_gap: gap,
            max_load_skew: 1.5,
        };
        assert_eq!(check.should_spill(), spill, "p={p} gap={gap}");
    }
}

#[test]
fn fleet_load_summarises_healthy_loads() {
    assert_eq!(FleetLoad::of([]), None);
    let fleet = FleetLoad::of([4, 0, 2]).unwrap();
    assert_eq!((fleet.min_load, fleet.healthy), (0, 3));
    assert!((fleet.mean_load - 2.0).abs() < 1e-12);
    let policy = PolicySettings {
        min_load_gap: 2,
        max_load_skew: 1.5,
        ..PolicySettings::default()
    };
    // 4 − 0 > 2 and 4 > 2 × 1.5: spills. 3 − 0 > 2 but 3 = 3: stays (both tests are strict).
    assert!(fleet.bound_for(4, &policy).should_spill());
    assert!(!fleet.bound_for(3, &policy).should_spill());
    assert_eq!(fleet.bound_for(3, &policy).gap_bound(), 2);
    let saturated = FleetLoad::of([u64::MAX])
        .unwrap()
        .bound_for(u64::MAX, &policy);
    assert_eq!(saturated.gap_bound(), u64::MAX);
}

#[test]
fn names_round_trip() {
    for kind in PolicyKind::ALL {
        assert_eq!(kind.as_str().parse::<PolicyKind>().unwrap(), kind);
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
    }
    for branch in Branch::ALL {
        assert_eq!(serde_json::to_value(branch).unwrap(), branch.as_str());
    }
    assert!("weighted".parse::<PolicyKind>().is_err());
    for order in SpillOrder::ALL {
        assert_eq!(order.as_str().parse::<SpillOrder>().unwrap(), order);
        assert_eq!(serde_json::to_value(order).unwrap(), order.as_str());
    }
    assert!(
        "random"
            .parse::<SpillOrder>()
            .unwrap_err()
            .to_string()
            .contains("spill_order")
    );
}

#[test]
fn settings_without_a_spill_order_read_as_ring() {
    let old: PolicySettings = serde_json::from_str(
        r#"{"kind":"bounded_consistent_hashing","min_load_gap":2,"max_load_skew":1.5,"virtual_nodes":150}"#,
    )
    .unwrap();
    assert_eq!(old, PolicySettings::default());
    let patched = old
        .patched(&PolicyPatch {
            spill_order: Some(SpillOrder::HashSeeded),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(patched.spill_order, SpillOrder::HashSeeded);
    assert_eq!(
        serde_json::to_value(patched).unwrap()["spill_order"],
        "hash_seeded"
    );
}
