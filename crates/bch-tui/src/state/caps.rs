//! Limits on what the console keeps, whatever a telemetry server sends: the console's memory stays
//! bounded against a gateway of a newer version, a broken one or a hostile one. Each limit is well
//! above what a gateway sends (`docs/tui.md`, "Limits"); what goes over it is dropped here, as a
//! frame applies, so no other part of the state ever holds more.
//!
//! Collections that a frame replaces (a ring, a discovery list) are only as large as one frame,
//! which the websocket's message limit bounds; the ones that frames add to (workers, keys, the
//! counters' baseline) are capped in count, and every string kept in them in length.

use std::collections::BTreeMap;

use bch_core::telemetry::{
    DiscoverySource, KeyRecord, Open, SpillEvent, WorkerRecord, WorkerSource,
};

/// Tracked keys kept: 16 times the gateway's default `[telemetry] max_keys` (256). Past it, the
/// least recently active keys go, as the gateway evicts its own.
pub const MAX_KEYS: usize = 4_096;
/// Workers kept: twice the 10,000 one gateway is built to route to. Workers past it (in the
/// gateway's order) are not shown.
pub const MAX_WORKERS: usize = 20_000;
/// Workers listed in one key's in-flight map: the key table shows a few and a count.
pub const MAX_KEY_WORKERS: usize = 64;
/// DNS discovery sources kept.
pub const MAX_DISCOVERY_SOURCES: usize = 1_024;
/// Models kept per worker (configured and reported each): a worker serves a few; past it, the
/// first in the gateway's order stay.
pub const MAX_WORKER_MODELS: usize = 64;
/// Bytes kept of any one string (a name, a key, a URL, an error); longer ones are cut at a
/// character boundary. Gateways cut key labels to 64 characters and errors are one line, so only
/// a hostile server reaches it.
pub const MAX_TEXT_BYTES: usize = 256;

/// Cuts `text` to [`MAX_TEXT_BYTES`] at a character boundary.
pub(super) fn cut(text: &mut String) {
    if text.len() > MAX_TEXT_BYTES {
        let mut end = MAX_TEXT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// `text` cut to [`MAX_TEXT_BYTES`] at a character boundary, without copying it.
pub(super) fn cut_str(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn cut_option(text: &mut Option<String>) {
    if let Some(text) = text {
        cut(text);
    }
}

/// Cuts every string of a worker record.
pub(super) fn worker(record: &mut WorkerRecord) {
    cut(&mut record.name);
    cut(&mut record.url);
    cut_option(&mut record.ring_id);
    cut_option(&mut record.probe_failure);
    if let Open::Known(WorkerSource::Dns(name)) | Open::Unknown(name) = &mut record.source {
        cut(name);
    }
    record.models.truncate(MAX_WORKER_MODELS);
    record.models.iter_mut().for_each(cut);
    if let Some(reported) = &mut record.reported_models {
        reported.truncate(MAX_WORKER_MODELS);
        reported.iter_mut().for_each(cut);
    }
}

/// At most [`MAX_WORKERS`] workers (the first, in the gateway's order), every string cut.
pub(super) fn workers(records: &mut Vec<WorkerRecord>) {
    records.truncate(MAX_WORKERS);
    records.iter_mut().for_each(worker);
}

/// A key record with every string cut and at most [`MAX_KEY_WORKERS`] in-flight entries (the
/// busiest).
pub(super) fn key(mut record: KeyRecord) -> KeyRecord {
    cut(&mut record.key);
    cut(&mut record.preferred);
    cut(&mut record.current);
    let too_long = record.active.len() > MAX_KEY_WORKERS
        || record.active.keys().any(|w| w.len() > MAX_TEXT_BYTES);
    if too_long {
        let mut busiest: Vec<(String, u64)> =
            std::mem::take(&mut record.active).into_iter().collect();
        busiest.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        busiest.truncate(MAX_KEY_WORKERS);
        for (mut name, n) in busiest {
            cut(&mut name);
            *record.active.entry(name).or_default() += n;
        }
    }
    record
}

/// A spill event with every string cut.
pub(super) fn spill(mut event: SpillEvent) -> SpillEvent {
    cut(&mut event.key);
    cut(&mut event.from);
    cut(&mut event.to);
    event
}

/// A discovery list of at most [`MAX_DISCOVERY_SOURCES`], every string cut.
pub(super) fn discovery(mut sources: Vec<DiscoverySource>) -> Vec<DiscoverySource> {
    sources.truncate(MAX_DISCOVERY_SOURCES);
    for source in &mut sources {
        cut(&mut source.name);
        cut(&mut source.source);
        cut_option(&mut source.last_error);
    }
    sources
}

/// Drops the least recently active keys until at most [`MAX_KEYS`] remain (ties: the greater
/// label goes, so the result does not depend on the map's history).
pub(super) fn evict_keys(keys: &mut BTreeMap<String, KeyRecord>) {
    let over = keys.len().saturating_sub(MAX_KEYS);
    if over == 0 {
        return;
    }
    let mut by_age: Vec<(u64, &String)> = keys.iter().map(|(k, r)| (r.last_seen_ms, k)).collect();
    by_age.select_nth_unstable_by(over - 1, |a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
    let gone: Vec<String> = by_age[..over].iter().map(|(_, k)| (*k).clone()).collect();
    for key in gone {
        keys.remove(&key);
    }
}
