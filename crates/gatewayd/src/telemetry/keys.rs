//! Routing keys as telemetry sees them: the identity a request's key is tracked under
//! ([`KeyTag`]), and the table of the most recently active keys with their placement
//! ([`KeyTracker`]), bounded by `[telemetry] max_keys` with oldest-first eviction.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bch_core::decide::Decision;
use bch_core::router::RoutingTable;
use bch_core::routing_key::{ExplicitKey, ImplicitKey, MAX_EXPLICIT_KEY_BYTES, RoutingKey};
use bch_core::telemetry::{KeyKind, KeyRecord};

/// A routing key as telemetry sees it: an identity plus what its display label is made from.
/// Implicit keys carry only their hash, so no credential ever reaches the aggregator.
///
/// The label is rendered by the aggregator, and only when it needs one (a key it does not track
/// yet, a spill event): the data path copies at most [`MAX_EXPLICIT_KEY_BYTES`] bytes inline and
/// allocates nothing per request.
#[derive(Debug, Clone)]
pub struct KeyTag {
    pub(super) id: u64,
    kind: KeyKind,
    pub(super) label: KeyLabel,
}

/// What a key's display label is rendered from.
#[derive(Debug, Clone)]
pub(super) enum KeyLabel {
    Explicit {
        redact: bool,
        len: u8,
        text: [u8; MAX_EXPLICIT_KEY_BYTES],
    },
    Implicit(ImplicitKey),
}

impl KeyLabel {
    /// The label the key would get from [`ExplicitKey::label`] / [`ImplicitKey::label`].
    pub(super) fn render(&self) -> Arc<str> {
        match self {
            KeyLabel::Explicit { redact, len, text } => {
                match ExplicitKey::parse(&text[..usize::from(*len)]) {
                    Ok(key) => key.label(*redact).into(),
                    Err(_) => Arc::from(""),
                }
            }
            KeyLabel::Implicit(key) => key.label().into(),
        }
    }
}

impl KeyTag {
    /// Telemetry identity of a request's key; `None` for target-worker and keyless requests, which
    /// are not tracked per key. `redact` shows explicit keys hashed instead of as text.
    pub fn from_key(key: &RoutingKey<'_>, redact: bool) -> Option<KeyTag> {
        match key {
            RoutingKey::Explicit(explicit) => {
                let raw = explicit.as_str().as_bytes();
                let mut text = [0u8; MAX_EXPLICIT_KEY_BYTES];
                // A parsed explicit key is at most MAX_EXPLICIT_KEY_BYTES (128) bytes.
                let len = raw.len().min(MAX_EXPLICIT_KEY_BYTES);
                text[..len].copy_from_slice(&raw[..len]);
                Some(KeyTag {
                    id: explicit.position(),
                    kind: KeyKind::Explicit,
                    label: KeyLabel::Explicit {
                        redact,
                        len: len as u8,
                        text,
                    },
                })
            }
            RoutingKey::Implicit(implicit) => Some(KeyTag {
                // Flip a bit so an implicit key never shares a record with an explicit one that
                // happens to hash alike.
                id: implicit.position() ^ 1,
                kind: KeyKind::Implicit,
                label: KeyLabel::Implicit(*implicit),
            }),
            RoutingKey::Target(_) | RoutingKey::None => None,
        }
    }
}

/// One tracked key.
struct KeyState {
    kind: KeyKind,
    /// Rendered only when a record is built for a client: with more live keys than `max_keys`,
    /// most requests bring a new key, and most such keys are evicted before anyone looks.
    label: KeyLabel,
    preferred: String,
    current: String,
    /// Requests in flight per worker name. A count that drops to 0 keeps its entry (and its
    /// name's allocation) for the next worker the key lands on: a key whose requests come and go
    /// allocates nothing per request. Records show only the counts above 0.
    active: Vec<(String, u64)>,
    requests_total: u64,
    spills_total: u64,
    last_seen_ms: u64,
    dirty: bool,
}

impl KeyState {
    fn record(&self) -> KeyRecord {
        KeyRecord {
            key: self.label.render().to_string(),
            kind: self.kind.into(),
            preferred: self.preferred.clone(),
            current: self.current.clone(),
            active: self
                .active
                .iter()
                .filter(|(_, count)| *count > 0)
                .map(|(worker, count)| (worker.clone(), *count))
                .collect(),
            requests_total: self.requests_total,
            spills_total: self.spills_total,
            last_seen_ms: self.last_seen_ms,
        }
    }
}

/// The most recently active keys, at most `max_keys`, and what changed since the last tick.
pub(super) struct KeyTracker {
    max_keys: usize,
    keys: HashMap<u64, KeyState>,
    /// `(last_seen_ms, key id)` of every tracked key: the eviction order.
    by_age: BTreeSet<(u64, u64)>,
    /// Labels of keys evicted since the last tick, for clients to forget.
    removed: Vec<String>,
}

impl KeyTracker {
    pub(super) fn new(max_keys: usize) -> Self {
        Self {
            max_keys,
            keys: HashMap::new(),
            by_age: BTreeSet::new(),
            removed: Vec::new(),
        }
    }

    /// Records a routed request of `key` on `decision.worker`. `announce_evictions` is false while
    /// no client listens: a client that connects later starts from a snapshot.
    pub(super) fn routed(
        &mut self,
        ts_ms: u64,
        table: &RoutingTable,
        decision: &Decision,
        key: KeyTag,
        announce_evictions: bool,
    ) {
        let Some(worker) = decision.worker else {
            return;
        };
        let mut evicted = None;
        if !self.keys.contains_key(&key.id) && self.keys.len() >= self.max_keys {
            evicted = self.evict_oldest(announce_evictions);
        }
        if self.max_keys == 0 {
            return;
        }
        let state = self.entry(ts_ms, key, evicted);
        // Steady state (a tracked key on the same workers) allocates nothing: names are only
        // copied when they change.
        let worker_name = &table.workers()[worker].spec.name;
        match decision.preferred {
            Some(p) => copy_if_changed(&mut state.preferred, &table.workers()[p].spec.name),
            None => state.preferred.clear(),
        }
        match state
            .active
            .iter_mut()
            .find(|(name, _)| name == worker_name)
        {
            Some((_, count)) => *count += 1,
            None => match state.active.iter_mut().find(|(_, count)| *count == 0) {
                // An idle entry's name becomes this worker's, in its allocation.
                Some((name, count)) => {
                    copy_if_changed(name, worker_name);
                    *count = 1;
                }
                None => state.active.push((worker_name.clone(), 1)),
            },
        }
        copy_if_changed(&mut state.current, worker_name);
        state.requests_total += 1;
        // A spill by the bound or for want of room: either way the request left its preferred
        // worker, and the key's count must agree with the spill log.
        if decision.branch.moved() {
            state.spills_total += 1;
        }
        state.last_seen_ms = ts_ms;
        state.dirty = true;
    }

    /// The tracked state of `key`, created if new (in the allocations of `evicted`, the state of
    /// the key evicted for it, if any); moves the key to the young end of the age order.
    fn entry(&mut self, ts_ms: u64, key: KeyTag, evicted: Option<KeyState>) -> &mut KeyState {
        match self.keys.entry(key.id) {
            Entry::Occupied(entry) => {
                let state = entry.into_mut();
                if state.last_seen_ms != ts_ms {
                    self.by_age.remove(&(state.last_seen_ms, key.id));
                    self.by_age.insert((ts_ms, key.id));
                }
                state
            }
            Entry::Vacant(entry) => {
                self.by_age.insert((ts_ms, key.id));
                // With more live keys than `max_keys` most requests bring a new key and evict
                // one: the new key takes the evicted one's strings, so neither allocates.
                let (mut preferred, mut current, mut active) = evicted
                    .map(|state| (state.preferred, state.current, state.active))
                    .unwrap_or_default();
                preferred.clear();
                current.clear();
                for (_, count) in &mut active {
                    *count = 0;
                }
                entry.insert(KeyState {
                    kind: key.kind,
                    label: key.label,
                    preferred,
                    current,
                    active,
                    requests_total: 0,
                    spills_total: 0,
                    last_seen_ms: ts_ms,
                    dirty: true,
                })
            }
        }
    }

    /// Records the end of a request of the key `key_id` on the worker called `worker`.
    pub(super) fn finished(&mut self, key_id: u64, worker: &str) {
        if let Some(state) = self.keys.get_mut(&key_id)
            && let Some((_, count)) = state
                .active
                .iter_mut()
                .find(|(name, count)| *count > 0 && name == worker)
        {
            *count -= 1;
            state.dirty = true;
        }
    }

    /// Evicts the key seen longest ago: its state, for the key that takes its place.
    fn evict_oldest(&mut self, announce: bool) -> Option<KeyState> {
        // With more live keys than max_keys this runs for most requests: the age index makes it
        // O(log n) instead of a scan of every tracked key.
        let (_, id) = self.by_age.pop_first()?;
        let state = self.keys.remove(&id)?;
        if announce {
            self.removed.push(state.label.render().to_string());
        }
        Some(state)
    }

    /// Every tracked key's record, most recently seen first (for snapshots).
    pub(super) fn records(&self) -> Vec<KeyRecord> {
        let mut keys: Vec<&KeyState> = self.keys.values().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.last_seen_ms));
        keys.into_iter().map(KeyState::record).collect()
    }

    /// The records of the keys that changed since the last call, and the labels of the keys evicted
    /// since then; both are reset.
    pub(super) fn take_changes(&mut self) -> (Vec<KeyRecord>, Vec<String>) {
        let changed = self
            .keys
            .values_mut()
            .filter(|k| k.dirty)
            .map(|k| {
                k.dirty = false;
                k.record()
            })
            .collect();
        (changed, std::mem::take(&mut self.removed))
    }

    /// Forgets what changed (nobody is listening).
    pub(super) fn discard_changes(&mut self) {
        for key in self.keys.values_mut() {
            key.dirty = false;
        }
        self.removed.clear();
    }
}

fn copy_if_changed(slot: &mut String, value: &str) {
    if slot != value {
        slot.clear();
        slot.push_str(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_core::router::{Router, WorkerSpec};

    fn worker(name: &str, port: u16) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            url: format!("http://127.0.0.1:{port}"),
            ring_id: None,
            source: Default::default(),
            max_in_flight: None,
            models: Vec::new(),
        }
    }

    fn owned(text: &str) -> String {
        text.to_owned()
    }

    fn active(tracker: &KeyTracker) -> Vec<(String, Vec<(String, u64)>)> {
        tracker
            .records()
            .into_iter()
            .map(|record| (record.key, record.active.into_iter().collect()))
            .collect()
    }

    /// Counts that drop to 0 keep their entries for reuse, and a key evicted for another lends it
    /// its state: what clients see is as if every idle entry and evicted key were gone.
    #[test]
    fn recycled_entries_and_states_never_show() {
        let router = Router::new(vec![worker("a", 1), worker("b", 2)], Default::default()).unwrap();
        let table = router.table();
        let key = |text: &[u8]| {
            let explicit = RoutingKey::Explicit(ExplicitKey::parse(text).unwrap());
            KeyTag::from_key(&explicit, false).unwrap()
        };
        let on = |worker: usize| Decision {
            worker: Some(worker),
            ..router.route(&RoutingKey::None).decision
        };
        let mut tracker = KeyTracker::new(1);
        let first = key(b"first");
        tracker.routed(1, &table, &on(0), first.clone(), true);
        tracker.routed(1, &table, &on(0), first.clone(), true);
        tracker.finished(first.id, "a");
        assert_eq!(active(&tracker), [(owned("first"), vec![(owned("a"), 1)])]);
        tracker.finished(first.id, "a");
        assert_eq!(active(&tracker), [(owned("first"), vec![])]);
        // Idle on `a`: a request on `b` takes the idle entry, one on `a` again gets its own.
        tracker.routed(2, &table, &on(1), first.clone(), true);
        tracker.routed(2, &table, &on(0), first.clone(), true);
        assert_eq!(
            active(&tracker),
            [(owned("first"), vec![(owned("a"), 1), (owned("b"), 1)])]
        );
        // A second key evicts the first (max_keys 1) and starts from nothing, though in its
        // state; the first's requests ending later change nothing.
        let second = key(b"second");
        tracker.routed(3, &table, &on(1), second.clone(), true);
        tracker.finished(first.id, "a");
        let records = tracker.records();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].key, "second");
        assert_eq!(records[0].requests_total, 1);
        assert_eq!(records[0].current, "b");
        assert_eq!(
            records[0].active.clone().into_iter().collect::<Vec<_>>(),
            [(owned("b"), 1)]
        );
        assert_eq!(tracker.take_changes().1, ["first"]);
    }
}
