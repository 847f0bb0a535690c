//! The gateway's bounded, fair queue of requests that found no worker with room
//! (`bch_core::decide::Decision::wait`), shared by both front ends.
//!
//! - **Bounded**: at most `max_queued` requests wait at once (more are shed at once, `queue_full`),
//!   each for at most `queue_timeout_ms` (then it is shed, `queue_timeout`); `queue_timeout_ms = 0`
//!   sheds at once (`no_queue`).
//! - **Fair**: one bucket per routing key (an explicit key, an implicit key, a target worker; every
//!   keyless request shares one bucket), FIFO within a bucket, round-robin across buckets, so a hot
//!   key's many requests take turns with a cold key's one instead of going before it.
//! - **Decided again at admission**: a freed slot is offered to the bucket heads in turn; for each
//!   the router decides again against the loads of that moment ([`Router::route`], which takes the
//!   load in the same step). A head whose decision still says "wait" keeps its place and the next
//!   bucket is tried; a head that gets a worker (or a plain refusal: its worker left, no healthy
//!   worker at all) is handed that [`Routed`] and leaves the queue.
//! - **Holds nothing**: a waiting request holds no load; a request whose client leaves (its future
//!   dropped) leaves the queue at once, and a decision already handed to it is dropped with its load.
//!
//! Wake-ups: a released load ([`AdmissionQueue::slot_freed`], called by the one place load ends,
//! `routing::hold`) runs the hand-out in the releasing task, so a freed slot goes to a waiting
//! request before a later arrival can see it. Everything else that can make room changes the
//! routing table or the loads without passing through here: health, membership, policy and
//! capacity changes, engine reports, and under `[load] source = "worker_metrics"` each scrape's
//! fleet-wide load. Those are caught by a re-check every [`RECHECK`] while requests wait (none when
//! the queue is empty): one signal for all of them, bounded in cost by the number of buckets, and
//! short next to a scrape interval.
//!
//! Arrivals with an empty queue pay one atomic load ([`AdmissionQueue::is_empty`]) and take no lock.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bch_core::admission::{AdmissionSettings, ShedReason};
use bch_core::router::{PoolId, Routed, Router};
use bch_core::routing_key::{ExplicitKey, ImplicitKey, RoutingKey};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::stats::AdmissionStats;

/// How often waiting requests are offered room that appeared without a released load (see the
/// module documentation).
pub const RECHECK: Duration = Duration::from_millis(20);

/// A request's routing key, owned, as the queue keeps it: the bucket it waits in and the key its
/// decision is taken again with.
#[derive(Debug, Clone)]
pub enum QueueKey {
    /// A target worker header's raw value.
    Target(Box<[u8]>),
    /// An explicit routing key.
    Explicit(Box<str>),
    /// An implicit key (only its hash is kept, never the credential).
    Implicit(ImplicitKey),
    /// No key: every keyless request shares this bucket.
    Keyless,
}

impl QueueKey {
    /// The owned copy of `key`.
    pub fn of(key: &RoutingKey<'_>) -> Self {
        match key {
            RoutingKey::Target(raw) => QueueKey::Target((*raw).into()),
            RoutingKey::Explicit(key) => QueueKey::Explicit(key.as_str().into()),
            RoutingKey::Implicit(key) => QueueKey::Implicit(*key),
            RoutingKey::None => QueueKey::Keyless,
        }
    }

    /// The key to decide with, borrowed from this one.
    pub fn routing_key(&self) -> RoutingKey<'_> {
        match self {
            QueueKey::Target(raw) => RoutingKey::Target(raw),
            // It parsed when the request arrived, so it parses again.
            QueueKey::Explicit(key) => {
                ExplicitKey::parse(key.as_bytes()).map_or(RoutingKey::None, RoutingKey::Explicit)
            }
            QueueKey::Implicit(key) => RoutingKey::Implicit(*key),
            QueueKey::Keyless => RoutingKey::None,
        }
    }
}

impl PartialEq for QueueKey {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (QueueKey::Target(a), QueueKey::Target(b)) => a == b,
            (QueueKey::Explicit(a), QueueKey::Explicit(b)) => a == b,
            (QueueKey::Implicit(a), QueueKey::Implicit(b)) => a == b,
            (QueueKey::Keyless, QueueKey::Keyless) => true,
            _ => false,
        }
    }
}

impl Eq for QueueKey {}

impl Hash for QueueKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            QueueKey::Target(raw) => raw.hash(state),
            QueueKey::Explicit(key) => key.hash(state),
            QueueKey::Implicit(key) => key.hash(state),
            QueueKey::Keyless => {}
        }
    }
}

/// A request that was admitted after waiting: its decision (with the load taken) and how long it
/// waited.
#[derive(Debug)]
pub struct Admitted {
    /// The decision taken at admission; `decision.worker` is set unless the request was refused
    /// for another reason meanwhile (its worker left, no healthy worker at all).
    pub routed: Routed,
    /// Time spent in the queue.
    pub waited: Duration,
}

/// A bucket of waiting requests: their model (the pool they are decided in) and their key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bucket {
    model: Option<Arc<str>>,
    key: QueueKey,
}

/// One waiting request, in its bucket.
struct Waiter {
    id: u64,
    handed: oneshot::Sender<Routed>,
}

/// The buckets, under the queue's lock.
#[derive(Default)]
struct Buckets {
    next_id: u64,
    by_key: HashMap<Bucket, VecDeque<Waiter>>,
    /// The non-empty buckets in round-robin order: the front is offered the next slot.
    turns: VecDeque<Bucket>,
}

/// See the module documentation. One per gateway.
pub struct AdmissionQueue {
    router: Arc<Router>,
    stats: Arc<AdmissionStats>,
    /// Requests waiting now; read without the lock for the empty fast path.
    queued: AtomicUsize,
    buckets: Mutex<Buckets>,
    /// Wakes the re-check task when the queue stops being empty.
    not_empty: Notify,
    /// Time admitted requests waited, seconds.
    wait_seconds: Histogram,
    /// Cancelled when the gateway shuts down: waiting requests are shed at once (`shutdown`) and
    /// none starts waiting, so each gets a clean answer before the shutdown grace ends.
    closed: CancellationToken,
}

impl std::fmt::Debug for AdmissionQueue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AdmissionQueue")
            .field("queued", &self.len())
            .finish_non_exhaustive()
    }
}

impl AdmissionQueue {
    /// An empty queue over `router`'s decisions, counting into `stats`. Call
    /// [`AdmissionQueue::start_recheck`] once a tokio runtime runs.
    pub fn new(router: Arc<Router>, stats: Arc<AdmissionStats>) -> Arc<Self> {
        Arc::new(AdmissionQueue {
            router,
            stats,
            queued: AtomicUsize::new(0),
            buckets: Mutex::new(Buckets::default()),
            not_empty: Notify::new(),
            // 1 ms .. ~65 s: a wait is bounded by `queue_timeout_ms`.
            wait_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            closed: CancellationToken::new(),
        })
    }

    /// Runs the periodic re-check (every [`RECHECK`] while requests wait) until `shutdown`, which
    /// also closes the queue ([`AdmissionQueue::close`]).
    pub fn start_recheck(self: &Arc<Self>, shutdown: CancellationToken) {
        let queue = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                if queue.is_empty() {
                    tokio::select! {
                        () = queue.not_empty.notified() => {}
                        () = shutdown.cancelled() => break,
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(RECHECK) => queue.hand_out(),
                    () = shutdown.cancelled() => break,
                }
            }
            queue.close();
        });
    }

    /// Sheds every waiting request at once (reason `shutdown`) and every later one that would
    /// wait: on shutdown nothing is worth waiting for, and a request still waiting when the grace
    /// ends would lose its connection without an answer.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// The counters this queue keeps.
    pub fn stats(&self) -> &Arc<AdmissionStats> {
        &self.stats
    }

    /// The wait-time histogram of admitted requests, seconds.
    pub fn wait_seconds(&self) -> &Histogram {
        &self.wait_seconds
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Whether no request waits: one atomic load, no lock.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A load was released: offers the slot to waiting requests. Nothing (one atomic load) when
    /// none waits.
    pub fn slot_freed(&self) {
        if !self.is_empty() {
            self.hand_out();
        }
    }

    /// Waits for room for `key`'s request under `settings`, or says why it is shed (counted
    /// here). The future owns everything it needs; dropping it (the client left) takes the request
    /// out of the queue at once.
    pub fn wait(
        self: &Arc<Self>,
        key: QueueKey,
        model: Option<Arc<str>>,
        settings: &AdmissionSettings,
    ) -> impl Future<Output = Result<Admitted, ShedReason>> + Send + 'static {
        let queue = Arc::clone(self);
        let timeout = Duration::from_millis(settings.queue_timeout_ms);
        let max_queued = settings.max_queued;
        async move {
            let mut ticket = match queue.join(Bucket { model, key }, timeout, max_queued) {
                Ok(ticket) => ticket,
                Err(reason) => {
                    queue.stats.record_shed(reason);
                    return Err(reason);
                }
            };
            let started = Instant::now();
            // Why it gives up if it does: its time ran out, or the gateway is shutting down.
            let (outcome, reason) = tokio::select! {
                outcome = tokio::time::timeout_at(started + timeout, &mut ticket.handed) => {
                    (outcome.map_err(|_| ()), ShedReason::QueueTimeout)
                }
                () = queue.closed.cancelled() => (Err(()), ShedReason::Shutdown),
            };
            let routed = match outcome {
                Ok(Ok(routed)) => Some(routed),
                // The sender is only dropped with the queue: nothing will hand it a slot.
                Ok(Err(_)) => None,
                Err(()) if ticket.leave() => None,
                // Handed a decision just as it gave up: take it.
                Err(()) => ticket.handed.try_recv().ok(),
            };
            ticket.done = true;
            match routed {
                Some(routed) => {
                    let waited = started.elapsed();
                    queue.wait_seconds.observe(waited.as_secs_f64());
                    Ok(Admitted { routed, waited })
                }
                None => {
                    queue.stats.record_shed(reason);
                    Err(reason)
                }
            }
        }
    }

    /// Puts a request in its bucket, or says why it cannot wait.
    fn join(
        self: &Arc<Self>,
        key: Bucket,
        timeout: Duration,
        max_queued: u64,
    ) -> Result<Ticket, ShedReason> {
        if timeout.is_zero() {
            return Err(ShedReason::NoQueue);
        }
        if self.closed.is_cancelled() {
            return Err(ShedReason::Shutdown);
        }
        let (sender, receiver) = oneshot::channel();
        let id = {
            let mut buckets = self.lock();
            if self.len() as u64 >= max_queued {
                return Err(ShedReason::QueueFull);
            }
            buckets.next_id += 1;
            let id = buckets.next_id;
            let bucket = buckets.by_key.entry(key.clone()).or_default();
            let was_empty = bucket.is_empty();
            bucket.push_back(Waiter { id, handed: sender });
            if was_empty {
                buckets.turns.push_back(key.clone());
            }
            self.queued.fetch_add(1, Ordering::AcqRel);
            self.stats.record_wait_started();
            id
        };
        self.not_empty.notify_one();
        Ok(Ticket {
            queue: Arc::clone(self),
            key,
            id,
            handed: receiver,
            done: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A decision for `bucket`'s head, in its model's pool of the table in force. A model no
    /// worker serves any more is decided in a pool the table does not have: no worker, so the
    /// request is handed its refusal.
    fn route(&self, bucket: &Bucket) -> Routed {
        let key = bucket.key.routing_key();
        let Some(model) = &bucket.model else {
            return self.router.route(&key);
        };
        let table = self.router.table();
        let pool = (table.pool_of_model(model)).unwrap_or(PoolId::new(table.pools().len()));
        self.router.route_in(&key, pool)
    }

    /// Offers room to the bucket heads in round-robin order until a full round admits nobody.
    /// Each admission takes a slot (or hands out a refusal), so this ends.
    fn hand_out(&self) {
        let mut buckets = self.lock();
        let mut refused_in_a_row = 0;
        while refused_in_a_row < buckets.turns.len() {
            let Some(key) = buckets.turns.pop_front() else {
                break;
            };
            let routed = self.route(&key);
            if routed.decision.worker.is_none() && routed.decision.wait.is_some() {
                // Still no room for this key: it keeps its place, the next bucket is tried.
                buckets.turns.push_back(key);
                refused_in_a_row += 1;
                continue;
            }
            refused_in_a_row = 0;
            let bucket = buckets.by_key.get_mut(&key).expect("a turn has its bucket");
            let waiter = bucket
                .pop_front()
                .expect("a bucket with a turn is not empty");
            if bucket.is_empty() {
                buckets.by_key.remove(&key);
            } else {
                // Its next request waits for the bucket's next turn, after the others.
                buckets.turns.push_back(key);
            }
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.stats.record_wait_ended();
            // A waiter leaves the queue under this lock before it drops its receiver, so the send
            // only fails if that ever changes; the decision (and its load) is dropped then.
            drop(waiter.handed.send(routed));
        }
    }
}

/// A request's place in the queue, held by its waiting future.
struct Ticket {
    queue: Arc<AdmissionQueue>,
    key: Bucket,
    id: u64,
    handed: oneshot::Receiver<Routed>,
    /// Set once the outcome was taken; until then a drop is a client leaving.
    done: bool,
}

impl Ticket {
    /// Takes the request out of its bucket; `false` when it was not there any more (a decision
    /// was handed to it).
    fn leave(&mut self) -> bool {
        let queue = &self.queue;
        let mut buckets = queue.lock();
        let Some(bucket) = buckets.by_key.get_mut(&self.key) else {
            return false;
        };
        let Some(place) = bucket.iter().position(|w| w.id == self.id) else {
            return false;
        };
        bucket.remove(place);
        if bucket.is_empty() {
            buckets.by_key.remove(&self.key);
            buckets.turns.retain(|k| k != &self.key);
        }
        queue.queued.fetch_sub(1, Ordering::AcqRel);
        queue.stats.record_wait_ended();
        true
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.done || self.leave() {
            return;
        }
        // The client left just after a decision was handed to it: its load ends here, and the slot
        // goes to the next waiting request.
        if let Ok(routed) = self.handed.try_recv() {
            drop(routed);
            self.queue.slot_freed();
        }
    }
}

#[cfg(test)]
mod tests;
