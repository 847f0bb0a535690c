//! When each worker is probed: once per `[health] interval_ms` at an offset of the interval
//! stable per worker (a hash of its key), so a fleet of N workers makes about N probes per
//! interval spread evenly over it instead of N at once; a worker's first probe, and a probe a front
//! end asked for, as soon as a slot is free, before the periodic ones waiting. No I/O and no
//! clock of its own: the prober passes `now` in, and starts what [`Schedule::next_start`] answers
//! while fewer than `max_concurrent_probes` run, so the schedule is tested with plain instants.
//!
//! A worker's periodic probe times are fixed (`epoch + phase + k × interval`, from half an
//! interval after it joined) whatever else it is probed for; one whose probe is still waiting or running when its next time comes skips that
//! time (coalesced), so a fleet the cap cannot probe every interval is probed as often as the cap
//! allows, each worker waiting at most once in the queue.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use crate::per_worker::WorkerKey;

/// Where one worker's probe stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing to do until its next periodic time (or an ask).
    Idle,
    /// Due, waiting for a free slot.
    Waiting,
    /// Started, not finished.
    Running,
}

/// One scheduled worker.
#[derive(Debug)]
struct Entry {
    /// Its next periodic probe time (also its key in [`Schedule::timeline`]).
    next_due: Instant,
    stage: Stage,
    /// No probe of it has finished yet: its first one is pending.
    first: bool,
    /// A front end asked for a probe of it since its last probe started.
    asked: bool,
}

/// What a finished probe was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Finished {
    /// The worker's first probe.
    pub first: bool,
    /// A front end asked for a probe of the worker while it waited or ran.
    pub asked: bool,
}

/// Every worker's next probe, and the probes due and not yet started.
#[derive(Debug)]
pub(super) struct Schedule {
    interval: Duration,
    /// The reference of every worker's phase.
    epoch: Instant,
    entries: HashMap<WorkerKey, Entry>,
    /// Every worker's next periodic time, earliest first.
    timeline: BTreeSet<(Instant, WorkerKey)>,
    /// First probes and asked ones: started before [`Schedule::periodic`]. May hold keys no
    /// longer waiting (removed, or started from the other queue); those are skipped.
    urgent: VecDeque<WorkerKey>,
    /// Periodic probes due, in the order they came due; skipped likewise.
    periodic: VecDeque<WorkerKey>,
    /// Workers whose first probe has not finished.
    firsts: usize,
}

impl Schedule {
    /// An empty schedule probing every `interval`, phases counted from `now`.
    pub(super) fn new(interval: Duration, now: Instant) -> Self {
        Self {
            interval: interval.max(Duration::from_millis(1)),
            epoch: now,
            entries: HashMap::new(),
            timeline: BTreeSet::new(),
            urgent: VecDeque::new(),
            periodic: VecDeque::new(),
            firsts: 0,
        }
    }

    /// The offset of `key`'s probes within every interval: a hash of the key, so it stays the
    /// same for the worker's whole life in this process, and a fleet's offsets spread evenly.
    fn phase(&self, key: &WorkerKey) -> Duration {
        // `DefaultHasher::new` has fixed keys: the same key hashes the same in one process.
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let interval = self.interval.as_nanos().max(1);
        Duration::from_nanos((u128::from(hasher.finish()) % interval) as u64)
    }

    /// `key`'s first periodic time strictly after `now`.
    fn next_after(&self, key: &WorkerKey, now: Instant) -> Instant {
        let first = self.epoch + self.phase(key);
        if first > now {
            return first;
        }
        let interval = self.interval.as_nanos();
        let periods = (now - first).as_nanos() / interval + 1;
        first + Duration::from_nanos((periods * interval) as u64)
    }

    /// Takes the probe interval in force: a new one moves every worker's next periodic time to
    /// its phase of the new interval.
    pub(super) fn set_interval(&mut self, interval: Duration, now: Instant) {
        let interval = interval.max(Duration::from_millis(1));
        if interval == self.interval {
            return;
        }
        self.interval = interval;
        self.timeline.clear();
        let keys: Vec<WorkerKey> = self.entries.keys().cloned().collect();
        for key in keys {
            let due = self.next_after(&key, now);
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.next_due = due;
            }
            self.timeline.insert((due, key));
        }
    }

    /// Makes the scheduled workers exactly `members`: a new one's first probe is due at once, a
    /// gone one is forgotten (a probe of it already running still finishes, and
    /// [`Schedule::finished`] ignores it).
    pub(super) fn set_members(&mut self, members: &[WorkerKey], now: Instant) {
        let mut gone: std::collections::HashSet<&WorkerKey> = self.entries.keys().collect();
        let mut added = Vec::new();
        for key in members {
            if !gone.remove(key) {
                added.push(key.clone());
            }
        }
        let gone: Vec<WorkerKey> = gone.into_iter().cloned().collect();
        for key in gone {
            if let Some(entry) = self.entries.remove(&key) {
                self.timeline.remove(&(entry.next_due, key));
                self.firsts -= usize::from(entry.first);
            }
        }
        for key in added {
            // Its first probe is now; its periodic ones start half an interval on at the
            // earliest, so a fleet joining at once (start-up) is not probed twice in its first
            // half interval: the second probe comes 0.5 to 1.5 intervals after the first.
            let due = self.next_after(&key, now + self.interval / 2);
            self.timeline.insert((due, key.clone()));
            self.urgent.push_back(key.clone());
            let entry = Entry {
                next_due: due,
                stage: Stage::Waiting,
                first: true,
                asked: false,
            };
            self.entries.insert(key, entry);
            self.firsts += 1;
        }
        // The queues forget removed workers lazily; rebuilt when mostly stale, so a membership
        // that keeps changing cannot grow them without bound.
        let waiting = self.urgent.len() + self.periodic.len();
        if waiting > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            let live =
                |key: &WorkerKey| entries.get(key).is_some_and(|e| e.stage == Stage::Waiting);
            self.urgent.retain(live);
            self.periodic.retain(live);
        }
    }

    /// A front end asked for a probe of `key` now: it is started before any periodic probe; one
    /// already running answers the ask. `false` for a worker not scheduled.
    pub(super) fn ask(&mut self, key: &WorkerKey) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        entry.asked = true;
        if entry.stage != Stage::Running {
            entry.stage = Stage::Waiting;
            self.urgent.push_back(key.clone());
        }
        true
    }

    /// Queues every worker whose periodic time came by `now` (unless its probe is waiting or
    /// running already) and moves its next time one interval on (past `now`, if the prober fell
    /// more than an interval behind).
    pub(super) fn advance(&mut self, now: Instant) {
        while let Some((due, key)) = self.timeline.first().cloned() {
            if due > now {
                break;
            }
            self.timeline.pop_first();
            let mut next = due + self.interval;
            if next <= now {
                next = self.next_after(&key, now);
            }
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            entry.next_due = next;
            if entry.stage == Stage::Idle {
                entry.stage = Stage::Waiting;
                self.periodic.push_back(key.clone());
            }
            self.timeline.insert((next, key));
        }
    }

    /// The next probe to start, urgent ones first; it is running from now on.
    pub(super) fn next_start(&mut self) -> Option<WorkerKey> {
        loop {
            let key = match self.urgent.pop_front() {
                Some(key) => key,
                None => self.periodic.pop_front()?,
            };
            if let Some(entry) = self.entries.get_mut(&key)
                && entry.stage == Stage::Waiting
            {
                entry.stage = Stage::Running;
                return Some(key);
            }
        }
    }

    /// Notes that `key`'s running probe finished; answers what it was for (`None` for a worker
    /// no longer scheduled). An ask that came while it ran is answered by it.
    pub(super) fn finished(&mut self, key: &WorkerKey) -> Option<Finished> {
        let entry = self.entries.get_mut(key)?;
        if entry.stage != Stage::Running {
            return None;
        }
        entry.stage = Stage::Idle;
        let finished = Finished {
            first: std::mem::replace(&mut entry.first, false),
            asked: std::mem::replace(&mut entry.asked, false),
        };
        self.firsts -= usize::from(finished.first);
        Some(finished)
    }

    /// When the next periodic probe comes due; `None` with no worker.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.timeline.first().map(|(due, _)| *due)
    }

    /// Workers whose first probe has not finished yet.
    pub(super) fn firsts_pending(&self) -> usize {
        self.firsts
    }
}

#[cfg(test)]
mod tests;
