//! A membership change as a delta (protocol version 2): the workers that left, the ones that
//! arrived with their place in the list, and the ones whose identity changed. One added worker at
//! 10,000 costs one record on the wire instead of the whole list.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::worker::WorkerRecord;

/// Sent (version 2) when worker membership or `virtual_nodes` changes. Applying it to the worker
/// list before the change ([`MembershipUpdate::apply_to`]) gives the list after it, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MembershipUpdate {
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// Virtual nodes per worker after the change (the ring is rebuilt with it).
    pub virtual_nodes: u32,
    /// Names of the workers that left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Whole records of workers that stayed (same name) but whose URL, ring identity or source
    /// changed: they replace the old records in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<WorkerRecord>,
    /// The workers that arrived, each with its position in the new list, positions ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<PlacedWorker>,
    /// How many workers there are after the change: a client whose list ends up with another
    /// count missed something and asks for a snapshot.
    pub worker_count: usize,
}

/// A worker that arrived, and where it goes in the list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacedWorker {
    /// Its position in the worker list after the change (0-based).
    pub index: usize,
    /// Its record.
    pub worker: WorkerRecord,
}

/// The fields of a record that make it the same worker on the ring and in the list.
fn same_identity(a: &WorkerRecord, b: &WorkerRecord) -> bool {
    a.url == b.url && a.ring_id == b.ring_id && a.source == b.source
}

impl MembershipUpdate {
    /// The delta from the worker list `before` to `after` (both in configuration order, names
    /// unique). When the workers in both lists are not in the same relative order (a reordering,
    /// which no membership change makes today), the delta removes every old worker and adds every
    /// new one, so applying it still gives `after` exactly.
    pub fn between(
        ts_ms: u64,
        before: &[WorkerRecord],
        after: &[WorkerRecord],
        virtual_nodes: u32,
    ) -> MembershipUpdate {
        let old: HashMap<&str, &WorkerRecord> =
            before.iter().map(|w| (w.name.as_str(), w)).collect();
        let new: HashSet<&str> = after.iter().map(|w| w.name.as_str()).collect();
        let kept_before = before.iter().filter(|w| new.contains(w.name.as_str()));
        let kept_after = after.iter().filter(|w| old.contains_key(w.name.as_str()));
        let order_kept = kept_before.map(|w| &w.name).eq(kept_after.map(|w| &w.name));
        let placed = |(index, worker): (usize, &WorkerRecord)| PlacedWorker {
            index,
            worker: worker.clone(),
        };
        if !order_kept {
            return MembershipUpdate {
                ts_ms,
                virtual_nodes,
                removed: before.iter().map(|w| w.name.clone()).collect(),
                changed: Vec::new(),
                added: after.iter().enumerate().map(placed).collect(),
                worker_count: after.len(),
            };
        }
        MembershipUpdate {
            ts_ms,
            virtual_nodes,
            removed: before
                .iter()
                .filter(|w| !new.contains(w.name.as_str()))
                .map(|w| w.name.clone())
                .collect(),
            changed: after
                .iter()
                .filter(|w| {
                    old.get(w.name.as_str())
                        .is_some_and(|old| !same_identity(old, w))
                })
                .cloned()
                .collect(),
            added: after
                .iter()
                .enumerate()
                .filter(|(_, w)| !old.contains_key(w.name.as_str()))
                .map(placed)
                .collect(),
            worker_count: after.len(),
        }
    }

    /// Applies the delta to `workers` (the list before the change, or already after it):
    /// removals, then changed records in place, then arrivals at their positions. Answers whether the result has
    /// [`MembershipUpdate::worker_count`] workers; when not, the list is not the gateway's and the
    /// client should ask for a snapshot.
    pub fn apply_to(&self, workers: &mut Vec<WorkerRecord>) -> bool {
        // Arrivals already in the list go too (and come back at their place): applying a delta
        // to a list that already has it, such as a snapshot taken just after the change, is
        // harmless, as applying any frame twice is.
        let gone: HashSet<&str> = self
            .removed
            .iter()
            .map(String::as_str)
            .chain(self.added.iter().map(|p| p.worker.name.as_str()))
            .collect();
        workers.retain(|w| !gone.contains(w.name.as_str()));
        if !self.changed.is_empty() {
            let changed: HashMap<&str, &WorkerRecord> =
                self.changed.iter().map(|w| (w.name.as_str(), w)).collect();
            for slot in workers.iter_mut() {
                if let Some(record) = changed.get(slot.name.as_str()) {
                    *slot = (*record).clone();
                }
            }
        }
        for placed in &self.added {
            let index = placed.index.min(workers.len());
            workers.insert(index, placed.worker.clone());
        }
        workers.len() == self.worker_count
    }
}
