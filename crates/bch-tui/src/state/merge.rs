//! The fleet across several replicas: one picture from what each replica describes (docs/tui.md,
//! "Several replicas").
//!
//! Per worker, the in-flight counts and counters are summed (every replica's requests are real
//! load on the worker); the load the rule reads is the highest any replica's rule reads (in
//! `worker_metrics` mode they all read about the fleet-wide number; in `local` mode each reads its
//! own share, and the highest share is what a spill would be decided on); a worker is healthy only
//! if every replica that knows it says so, draining if any replica drains it, and stale if any
//! replica routes it on local load. Key counters at the last policy change are summed like the
//! counters. Keys
//! are summed per worker, the spill logs interleaved by time, rates and totals summed. Capacity is
//! per worker (the same on every replica: the highest is kept, in case a reload is half-way); a
//! worker is full if any replica finds it full; the admission queues and sheds add up. Discovery
//! sources are listed once per source and state (the first replica's record of it), so one that
//! fails on some replicas and answers on others shows both ways.

use std::collections::BTreeMap;

use bch_core::telemetry::{
    AdmissionSummary, DiscoverySource, KeyRecord, WorkerRecord, WorkerState,
};

use super::picture::{Baseline, FleetPicture, SPILL_LOG_CAP, Sample};

/// The merged fleet of `fleets` (at least one). The policy and ring are the first replica's that
/// has one (the replica rows show where they differ).
pub(super) fn merge(fleets: &[&FleetPicture]) -> FleetPicture {
    let mut merged = FleetPicture::default();
    merged.ts_ms = fleets.iter().map(|f| f.ts_ms).max().unwrap_or(0);
    let with_policy = fleets.iter().find(|f| f.policy.is_some());
    merged.policy = with_policy.and_then(|f| f.policy);
    merged.policy_unknown = with_policy.and_then(|f| f.policy_unknown.clone());
    merged.policy_changed_by = fleets.iter().find_map(|f| f.policy_changed_by.clone());
    merged.policy_changed_from = fleets.iter().find_map(|f| f.policy_changed_from.clone());
    merged.baseline = merge_baselines(fleets);
    merged.tick_interval_ms = fleets.iter().filter_map(|f| f.tick_interval_ms).max();
    merged.workers = merge_workers(fleets);
    merged.keys = merge_keys(fleets);
    merged.dropped_events = fleets.iter().map(|f| f.dropped_events).sum();
    merged.history = merge_history(fleets);
    merged.discovery = merge_discovery(fleets);
    merged.admission = fleets
        .iter()
        .any(|f| f.admission.is_some())
        .then(|| AdmissionSummary::sum(fleets.iter().filter_map(|f| f.admission.as_ref())));
    for fleet in fleets {
        merged.totals.requests_per_s += fleet.totals.requests_per_s;
        merged.totals.spills_per_s += fleet.totals.spills_per_s;
        merged.totals.requests_total += fleet.totals.requests_total;
        merged.totals.spills_total += fleet.totals.spills_total;
    }
    if let Some(with_ring) = fleets.iter().find(|f| f.ring.is_some()) {
        merged.share_ring_of(with_ring);
    }
    let mut spills: Vec<_> = fleets
        .iter()
        .flat_map(|f| f.spills.iter().cloned())
        .collect();
    spills.sort_by_key(|s| s.ts_ms);
    let skip = spills.len().saturating_sub(SPILL_LOG_CAP);
    merged.spills = spills.into_iter().skip(skip).collect();
    merged
}

/// Every replica's discovery sources, each source in each state once, in the order the replicas
/// list them.
fn merge_discovery(fleets: &[&FleetPicture]) -> Vec<DiscoverySource> {
    let mut merged: Vec<DiscoverySource> = Vec::new();
    for source in fleets.iter().flat_map(|f| &f.discovery) {
        if !merged
            .iter()
            .any(|m| m.source == source.source && m.state == source.state)
        {
            merged.push(source.clone());
        }
    }
    merged
}

fn merge_workers(fleets: &[&FleetPicture]) -> Vec<WorkerRecord> {
    let mut merged: Vec<WorkerRecord> = Vec::new();
    for record in fleets.iter().flat_map(|f| &f.workers) {
        let Some(slot) = merged.iter_mut().find(|w| w.name == record.name) else {
            merged.push(WorkerRecord {
                load: Some(record.rule_load()),
                ..record.clone()
            });
            continue;
        };
        slot.healthy &= record.healthy;
        if record.state != WorkerState::Active {
            // Draining on one replica: that replica sends it nothing new, so it is not routable
            // fleet-wide either.
            slot.state = record.state.clone();
        }
        slot.active += record.active;
        slot.requests_total += record.requests_total;
        slot.spilled_in_total += record.spilled_in_total;
        slot.spilled_out_total += record.spilled_out_total;
        slot.errors_total += record.errors_total;
        slot.load = Some(slot.rule_load().max(record.rule_load()));
        slot.reported_load = slot.reported_load.max(record.reported_load);
        slot.scrape_age_ms = slot.scrape_age_ms.max(record.scrape_age_ms);
        slot.load_stale |= record.load_stale;
        slot.capacity = slot.capacity.max(record.capacity);
        slot.full |= record.full;
        if slot.probe_failure.is_none() {
            slot.probe_failure.clone_from(&record.probe_failure);
        }
    }
    merged
}

fn merge_keys(fleets: &[&FleetPicture]) -> BTreeMap<String, KeyRecord> {
    let mut merged: BTreeMap<String, KeyRecord> = BTreeMap::new();
    for key in fleets.iter().flat_map(|f| f.keys.values()) {
        let Some(slot) = merged.get_mut(&key.key) else {
            merged.insert(key.key.clone(), key.clone());
            continue;
        };
        for (worker, n) in &key.active {
            *slot.active.entry(worker.clone()).or_default() += n;
        }
        slot.requests_total += key.requests_total;
        slot.spills_total += key.spills_total;
        if key.last_seen_ms > slot.last_seen_ms {
            slot.last_seen_ms = key.last_seen_ms;
            slot.current = key.current.clone();
            slot.preferred = key.preferred.clone();
        }
    }
    merged
}

/// The key counters at the last policy change, summed over the replicas that saw one (a console's
/// change reaches every replica), so the summed key counters count from there; the latest time.
fn merge_baselines(fleets: &[&FleetPicture]) -> Option<Baseline> {
    let mut merged: Option<Baseline> = None;
    for baseline in fleets.iter().filter_map(|f| f.baseline.as_ref()) {
        let slot = merged.get_or_insert_with(Baseline::default);
        slot.ts_ms = slot.ts_ms.max(baseline.ts_ms);
        for (key, (requests, spills)) in &baseline.keys {
            let sum = slot.keys.entry(key.clone()).or_default();
            sum.0 += requests;
            sum.1 += spills;
        }
    }
    merged
}

/// Rates summed sample by sample, newest aligned with newest.
fn merge_history(fleets: &[&FleetPicture]) -> std::collections::VecDeque<Sample> {
    let longest = fleets.iter().map(|f| f.history.len()).max().unwrap_or(0);
    (0..longest)
        .map(|i| {
            let mut sum = Sample::default();
            for fleet in fleets {
                let offset = longest - fleet.history.len();
                if let Some(s) = i.checked_sub(offset).and_then(|j| fleet.history.get(j)) {
                    sum.requests_per_s += s.requests_per_s;
                    sum.spills_per_s += s.spills_per_s;
                    sum.shed_per_s += s.shed_per_s;
                    sum.waiting += s.waiting;
                }
            }
            sum
        })
        .collect()
}
