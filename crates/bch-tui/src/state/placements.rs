//! Placement history: for each routing key, which worker served it over time (at home on its
//! preferred worker, or off it and why), built from the frames the console already receives —
//! the spill events (each says from where to where and why) and the key records (each says where
//! the key's last request went). Gateway time throughout, so a replay of a recording builds the
//! same history frame by frame as the live run did.
//!
//! Bounded whatever a server sends: at most [`MAX_HISTORY_KEYS`] keys (the least recently active
//! go first), at most [`MAX_PLACEMENTS`] placements each (the oldest go first), every string cut
//! as the key table's are.

use std::collections::{BTreeMap, VecDeque};

use bch_core::policy::Branch;
use bch_core::telemetry::{KeyRecord, SpillCause, SpillEvent};

use super::caps;

/// Keys whose placement history is kept: a few times the gateway's default `max_keys` (256).
pub const MAX_HISTORY_KEYS: usize = 1_024;
/// Placements kept per key; a run of requests served the same way is one placement.
pub const MAX_PLACEMENTS: usize = 24;

/// Why a key was served where it was.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// On its preferred worker.
    Home,
    /// The bound fired: the preferred worker's load was above `min + gap` and `mean × skew`.
    Bound {
        /// The preferred worker's load before the request.
        preferred_load: u64,
        /// The lowest load of the healthy workers.
        min_load: u64,
        /// Their mean load.
        mean_load: f64,
        /// `min_load_gap` in force.
        min_load_gap: u64,
        /// `max_load_skew` in force.
        max_load_skew: f64,
    },
    /// The preferred worker was full (at its capacity, or its engine saturated).
    Capacity {
        /// The preferred worker's load before the request.
        preferred_load: u64,
    },
    /// The bound fired but no other worker was eligible: it stayed on the preferred worker.
    NoEligible {
        /// The preferred worker's load before the request.
        preferred_load: u64,
    },
    /// A spill branch or cause this console does not know (a newer gateway's), as sent.
    Unknown(String),
    /// Served off its preferred worker, with no spill event seen for it (it happened before this
    /// console connected, or in a frame that was lost).
    Unseen,
}

impl Reason {
    /// Whether this placement was off the key's preferred worker (or wanted to be).
    pub fn spilled(&self) -> bool {
        !matches!(self, Reason::Home)
    }

    /// Why the spill `event` happened, from its branch and cause (the numbers of the decision
    /// kept).
    pub fn of_spill(event: &SpillEvent) -> Self {
        let (Some(branch), Some(cause)) = (event.branch.get(), event.cause.get()) else {
            let mut names = format!("{} {}", event.branch, event.cause);
            caps::cut(&mut names);
            return Reason::Unknown(names);
        };
        match (branch, cause) {
            (Branch::ExplicitRoutingKeyNoEligibleCandidate, _) => Reason::NoEligible {
                preferred_load: event.preferred_load,
            },
            (_, SpillCause::Capacity) => Reason::Capacity {
                preferred_load: event.preferred_load,
            },
            _ => Reason::Bound {
                preferred_load: event.preferred_load,
                min_load: event.min_load,
                mean_load: event.mean_load,
                min_load_gap: event.min_load_gap,
                max_load_skew: event.max_load_skew,
            },
        }
    }

    /// Whether two reasons are the same kind of placement (numbers aside), so a run of them is
    /// one placement.
    fn same_kind(&self, other: &Reason) -> bool {
        match (self, other) {
            (Reason::Unknown(a), Reason::Unknown(b)) => a == b,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

/// A run of a key's requests served the same way: by `worker`, its preferred worker being
/// `preferred`, for `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Gateway time of the first request of the run, ms since the Unix epoch.
    pub first_ms: u64,
    /// Gateway time of the last one seen.
    pub last_ms: u64,
    /// The worker that served them.
    pub worker: String,
    /// The key's preferred worker then.
    pub preferred: String,
    /// Why there; for a spill, the numbers of the newest decision of the run.
    pub reason: Reason,
    /// Spill events in the run (0 for a run at home or one seen only in key records).
    pub spills: u64,
}

/// One key's placements, oldest first, at most [`MAX_PLACEMENTS`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyHistory {
    placements: VecDeque<Placement>,
}

impl KeyHistory {
    /// The placements, oldest first.
    pub fn placements(&self) -> impl DoubleEndedIterator<Item = &Placement> + ExactSizeIterator {
        self.placements.iter()
    }

    fn last_ms(&self) -> u64 {
        self.placements.back().map_or(0, |p| p.last_ms)
    }

    /// Extends the newest placement when `placement` continues it, else appends it.
    fn push(&mut self, placement: Placement) {
        if let Some(last) = self.placements.back_mut()
            && last.worker == placement.worker
            && last.preferred == placement.preferred
            && last.reason.same_kind(&placement.reason)
        {
            last.last_ms = last.last_ms.max(placement.last_ms);
            last.spills += placement.spills;
            if placement.spills > 0 {
                last.reason = placement.reason;
            }
            return;
        }
        self.placements.push_back(placement);
        while self.placements.len() > MAX_PLACEMENTS {
            self.placements.pop_front();
        }
    }

    /// A key record: its last request, at `last_seen_ms`, went to `current`, its preferred worker
    /// being `preferred` (both already cut). A record that agrees with the newest placement only
    /// moves its end; a new home or an unexplained move starts a placement.
    fn record(&mut self, current: &str, preferred: &str, last_seen_ms: u64) {
        if let Some(last) = self.placements.back_mut()
            && last.worker == current
            && last.preferred == preferred
        {
            last.last_ms = last.last_ms.max(last_seen_ms);
            return;
        }
        // A record older than what is known already (another replica's view of an earlier
        // request, a snapshot after a tick) says nothing about where the key is now.
        if self.last_ms() > last_seen_ms {
            return;
        }
        let reason = if current == preferred {
            Reason::Home
        } else {
            Reason::Unseen
        };
        self.push(Placement {
            first_ms: last_seen_ms,
            last_ms: last_seen_ms,
            worker: current.to_owned(),
            preferred: preferred.to_owned(),
            reason,
            spills: 0,
        });
    }
}

/// Every key's placement history, by key label.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlacementHistory {
    keys: BTreeMap<String, KeyHistory>,
    /// The newest spill event taken, gateway time: a snapshot's spill log repeats events a tick
    /// already brought, so only newer ones are taken from it.
    newest_spill_ms: u64,
}

impl PlacementHistory {
    /// `key`'s history, if any was seen.
    pub fn key(&self, key: &str) -> Option<&KeyHistory> {
        self.keys.get(key)
    }

    /// How many keys have a history.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key has a history yet.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Takes a frame's spill events (oldest first) and then its key records, as the gateway sent
    /// them. `from_snapshot`: the spills are a snapshot's log, of which only the events newer than
    /// any taken count.
    pub(super) fn observe(
        &mut self,
        spills: &[SpillEvent],
        keys: &[KeyRecord],
        from_snapshot: bool,
    ) {
        let watermark = self.newest_spill_ms;
        for event in spills {
            if from_snapshot && event.ts_ms <= watermark {
                continue;
            }
            self.newest_spill_ms = self.newest_spill_ms.max(event.ts_ms);
            let event = caps::spill(event.clone());
            let placement = Placement {
                first_ms: event.ts_ms,
                last_ms: event.ts_ms,
                reason: Reason::of_spill(&event),
                worker: event.to,
                preferred: event.from,
                spills: 1,
            };
            self.keys.entry(event.key).or_default().push(placement);
        }
        for record in keys {
            let label = caps::cut_str(&record.key);
            let (current, preferred) = (
                caps::cut_str(&record.current),
                caps::cut_str(&record.preferred),
            );
            match self.keys.get_mut(label) {
                Some(history) => history.record(current, preferred, record.last_seen_ms),
                None => self.keys.entry(label.to_owned()).or_default().record(
                    current,
                    preferred,
                    record.last_seen_ms,
                ),
            }
        }
        self.evict();
    }

    /// Drops the least recently active keys until at most [`MAX_HISTORY_KEYS`] remain (ties: the
    /// greater label goes, so the result does not depend on the map's history).
    fn evict(&mut self) {
        let over = self.keys.len().saturating_sub(MAX_HISTORY_KEYS);
        if over == 0 {
            return;
        }
        let mut by_age: Vec<(u64, &String)> =
            self.keys.iter().map(|(k, h)| (h.last_ms(), k)).collect();
        by_age.select_nth_unstable_by(over - 1, |a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
        let gone: Vec<String> = by_age[..over].iter().map(|(_, k)| (*k).clone()).collect();
        for key in gone {
            self.keys.remove(&key);
        }
    }
}
