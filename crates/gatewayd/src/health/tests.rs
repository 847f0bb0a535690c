//! The prober's unit tests: failure reasons, streaks, probe requests.

use super::failures::ProbeReason;
use super::*;
use crate::metrics::LabelValue;

fn key(url: &str) -> WorkerKey {
    WorkerKey::of(&bch_core::router::WorkerSpec {
        name: url.to_owned(),
        url: url.to_owned(),
        ring_id: None,
        source: bch_core::telemetry::WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    })
}

#[test]
fn a_flood_of_probe_requests_about_other_workers_never_crowds_one_out() {
    let (requests, mut queue) = ProbeRequests::channel();
    // A picker peer claiming fallbacks for other workers as fast as it can, before the
    // prober takes the next round's requests.
    for _ in 0..10 {
        for other in 0..100 {
            requests.probe(key(&format!("http://10.0.0.{other}:8000")));
        }
    }
    let real = key("http://10.0.1.1:8000");
    assert!(
        requests.probe(real.clone()),
        "the request about a worker really failing was dropped"
    );
    let asked = queue.take();
    assert!(asked.contains(&real));
    // One request per worker however often it was asked: the queue stays bounded by the
    // membership.
    assert_eq!(asked.len(), 101);
    assert!(queue.take().is_empty());
}

#[test]
fn every_reason_has_its_slot_and_its_label() {
    let labels: Vec<&str> = ProbeReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels, ["refused", "timeout", "status", "error", "tls"]);
    for (index, reason) in ProbeReason::ALL.iter().enumerate() {
        assert_eq!(reason.index(), index);
    }
    assert_eq!(ProbeFailure::Status(503).to_string(), "status 503");
    assert_eq!(
        ProbeFailure::Tls(crate::upstream::TlsProblem::Untrusted).to_string(),
        "tls: certificate not trusted (UnknownIssuer)"
    );
    assert_eq!(ProbeFailure::Timeout.to_string(), "timeout");
}

#[test]
fn streak_flips_at_thresholds_and_restarts_when_health_changed_elsewhere() {
    let thresholds = HealthConfig {
        unhealthy_threshold: 3,
        healthy_threshold: 2,
        ..HealthConfig::default()
    };
    let mut streak = Streak::default();
    assert_eq!(streak.observe(false, true, &thresholds), None);
    assert_eq!(streak.observe(false, true, &thresholds), None);
    assert_eq!(streak.observe(false, true, &thresholds), Some(false));
    // A new worker waiting for its first probe: one success lets it in, a failure keeps it
    // out until the normal threshold of successes.
    let mut waiting = Streak::default();
    assert_eq!(waiting.observe(true, false, &thresholds), Some(true));
    let mut waiting = Streak::default();
    assert_eq!(waiting.observe(false, false, &thresholds), None);
    assert_eq!(waiting.observe(true, false, &thresholds), None);
    assert_eq!(waiting.observe(true, false, &thresholds), Some(true));
    streak.seen_healthy = Some(false);
    assert_eq!(streak.observe(true, false, &thresholds), None);
    assert_eq!(streak.observe(true, false, &thresholds), Some(true));
    // Passive marking flipped the worker to unhealthy behind the prober's back: the two
    // successes seen while it was unhealthy do not count, it needs two fresh ones.
    let mut streak = Streak::default();
    assert_eq!(streak.observe(true, true, &thresholds), None);
    assert_eq!(streak.observe(true, false, &thresholds), None);
    assert_eq!(streak.observe(true, false, &thresholds), Some(true));
    // A failure resets the successes (of a worker probed before).
    let mut streak = Streak {
        seen_healthy: Some(false),
        ..Streak::default()
    };
    streak.observe(true, false, &thresholds);
    streak.observe(false, false, &thresholds);
    assert_eq!(streak.observe(true, false, &thresholds), None);
}
