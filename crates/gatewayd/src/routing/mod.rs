//! The routing step both front ends share — the data plane (`proxy`) and Envoy's endpoint picker
//! (`picker`): the declared body size, the routing key, the decision and the load it reserves,
//! the branch metric and the telemetry event, in that order, from one function ([`route`]), so a
//! request is placed and counted the same way whichever front end received it.
//!
//! A failed connect the data plane saw itself is accounted here too: [`connect_failed`] and
//! [`retry_on`]. The picker only hears of failed connects from its peer, and asks the prober to
//! look instead (`picker::session`).
//!
//! Files: [`handle`] (the narrow handle, [`Routing`]), [`exchange`] (one request's record),
//! [`hold`] (its load on a worker), [`request_id`] (its id), [`key`] (key and size from either
//! kind of header list). The steps are functions here rather than methods of [`Routing`]: a
//! method lives next to its type, in `handle.rs`, and these take an [`Exchange`], whose file
//! already uses `handle.rs` (the file graph must stay acyclic).

pub mod exchange;
pub mod handle;
pub mod hold;
pub mod key;
pub mod request_id;
pub mod route_by;

use std::sync::Arc;

use std::time::Duration;

use bch_core::admission::ShedReason;
use bch_core::load::LoadGuard;
use bch_core::policy::Branch;
use bch_core::router::{PoolId, Routed, RoutingTable};
use bch_core::routing_key::RoutingKey;

pub use exchange::Exchange;
pub use handle::Routing;
pub use key::HeaderLookup;
pub use route_by::RouteBy;

use crate::admission::{Admitted, QueueKey};
use crate::config::runtime::RuntimeSettings;
use crate::error::GatewayError;
use crate::telemetry::keys::KeyTag;
use key::content_length;

/// Where a routed request went: the table it was decided on, the worker that holds its load (the
/// guard is in the [`Exchange`]), the branch, and the key's ring position when it has one (the
/// start of its fallback walk).
#[derive(Debug, Clone)]
pub struct Choice {
    /// The routing table the decision used; `worker` indexes it.
    pub table: Arc<RoutingTable>,
    /// The chosen worker, an index into `table.workers()`.
    pub worker: usize,
    /// Why this worker.
    pub branch: Branch,
    /// Ring position of the explicit or implicit key; `None` for target-worker and keyless
    /// requests.
    pub position: Option<u64>,
    /// The pool of `table` the decision was taken in: fallbacks come from it too.
    pub pool: PoolId,
}

/// A request the router found no room for, waiting for its turn in the admission queue: its key
/// and the decision that said "wait" (for the answer's branch if it is shed).
pub struct Waiting {
    /// The request's key, owned, as the queue keeps it.
    pub key: QueueKey,
    /// The request's model: it waits for room in that model's pool.
    pub model: Option<Arc<str>>,
    /// The waiting decision and the table it was taken on (no load is held).
    pub routed: Routed,
}

/// What the synchronous part of routing found: a worker (or a refusal, as the error), or no room.
pub enum Placement {
    /// Routed (load taken on the worker).
    Chosen(Choice),
    /// No worker it may use has room: the request waits ([`admit`]) or is shed.
    Wait(Waiting),
}

/// Checks the declared body size against `max_body_bytes` (413), extracts the routing key, decides
/// and takes load on the chosen worker in one step, counts the branch, tells telemetry, and hands
/// the load guard to `exchange`. A refusal (413; no worker at all, no healthy worker, a
/// target-worker miss) is the `GatewayError` to answer with, through [`Exchange::fail`]; the
/// exchange already knows the branch. A request that finds no worker with room waits in the
/// admission queue and is decided again when a slot frees; one that cannot wait is shed
/// ([`GatewayError::Shed`]).
pub async fn route<H: HeaderLookup + ?Sized>(
    routing: &Routing,
    settings: &RuntimeSettings,
    headers: &H,
    by: &RouteBy,
    exchange: &mut Exchange,
) -> Result<Choice, GatewayError> {
    match route_now(routing, settings, headers, by, exchange)? {
        Placement::Chosen(choice) => Ok(choice),
        Placement::Wait(waiting) => {
            let admission = waiting.routed.table.policy().admission;
            let outcome = routing
                .queue
                .wait(waiting.key.clone(), waiting.model.clone(), &admission)
                .await;
            admit(routing, settings, waiting, outcome, exchange)
        }
    }
}

/// [`route`] up to the queue: everything that needs no waiting. The picker calls it directly, so
/// a request that needs no queue costs no future of its own. The decision is taken in the pool of
/// `by`'s model (a model no worker serves is [`GatewayError::ModelNotFound`]), by the key `by`
/// and the headers give ([`RouteBy::key`]).
pub fn route_now<H: HeaderLookup + ?Sized>(
    routing: &Routing,
    settings: &RuntimeSettings,
    headers: &H,
    by: &RouteBy,
    exchange: &mut Exchange,
) -> Result<Placement, GatewayError> {
    let limit = settings.max_body_bytes;
    if let Some(length) = content_length(headers).filter(|l| *l > limit) {
        return Err(GatewayError::PayloadTooLarge {
            length: Some(length),
            limit,
        });
    }
    // Only a request with a model looks its pool up: the others route in the one pool.
    let pool = match by.model {
        Some(_) => by.pool(&routing.router.table())?,
        None => PoolId::FIRST,
    };
    let extracted = by.key(&settings.routing_headers, headers);
    if let Some(reason) = extracted.ignored_explicit {
        routing.metrics.record_ignored_key(reason);
    }
    let routed = routing.router.route_in(&extracted.key, pool);
    if routed.decision.worker.is_none() && routed.decision.wait.is_some() {
        return Ok(Placement::Wait(Waiting {
            key: QueueKey::of(&extracted.key),
            model: by.model.clone(),
            routed,
        }));
    }
    settle(routing, settings, &extracted.key, routed, None, exchange).map(Placement::Chosen)
}

/// The end of a wait: the request admitted with the decision taken at admission, or shed with
/// `reason` (503 with `Retry-After`, the waiting decision's branch).
pub fn admit(
    routing: &Routing,
    settings: &RuntimeSettings,
    waiting: Waiting,
    outcome: Result<Admitted, ShedReason>,
    exchange: &mut Exchange,
) -> Result<Choice, GatewayError> {
    let key = waiting.key.routing_key();
    match outcome {
        Ok(admitted) => settle(
            routing,
            settings,
            &key,
            admitted.routed,
            Some(admitted.waited),
            exchange,
        ),
        Err(reason) => {
            let mut routed = waiting.routed;
            let retry_after_secs = routed.table.policy().admission.retry_after_secs();
            account(routing, settings, &key, &mut routed, exchange);
            Err(GatewayError::Shed {
                reason,
                retry_after_secs,
            })
        }
    }
}

/// Counts the final decision's branch, tells telemetry, and hands its load guard (when a worker
/// was chosen) to the exchange, which also learns the branch.
fn account(
    routing: &Routing,
    settings: &RuntimeSettings,
    key: &RoutingKey<'_>,
    routed: &mut Routed,
    exchange: &mut Exchange,
) {
    let decision = &routed.decision;
    (routing.metrics).record_branch(decision.branch, &routed.table, routed.pool);
    let tag = KeyTag::from_key(key, settings.redact_keys);
    routing
        .telemetry
        .routed(&routed.table, decision, tag.clone());
    exchange.routed(&routed.table, decision, routed.guard.take(), tag);
}

/// Accounts the final decision ([`account`]) and turns it into the choice or the refusal.
fn settle(
    routing: &Routing,
    settings: &RuntimeSettings,
    key: &RoutingKey<'_>,
    mut routed: Routed,
    waited: Option<Duration>,
    exchange: &mut Exchange,
) -> Result<Choice, GatewayError> {
    account(routing, settings, key, &mut routed, exchange);
    let pool = routed.pool;
    let decision = routed.decision;
    let Some(worker) = decision.worker else {
        return Err(match decision.branch {
            Branch::TargetWorkerMiss => GatewayError::TargetWorkerMiss,
            _ if routed.table.workers().is_empty() => GatewayError::NoWorkers,
            _ => GatewayError::NoHealthyWorkers,
        });
    };
    routing.queue.stats().record_admitted(waited.is_some());
    exchange.waited(waited);
    Ok(Choice {
        table: routed.table,
        worker,
        branch: decision.branch,
        position: key.position(),
        pool,
    })
}

/// A connection to `worker` failed before anything of the request reached it: the error counts
/// against the worker the exchange holds, and with passive health on the worker is marked
/// unhealthy until probes bring it back. `cause` is for the log line.
pub fn connect_failed(
    routing: &Routing,
    settings: &RuntimeSettings,
    table: &RoutingTable,
    worker: usize,
    exchange: &mut Exchange,
    cause: &str,
) {
    exchange.record_error();
    let name = &table.workers()[worker].spec.name;
    if settings.passive_health && routing.router.set_health(name, false) {
        tracing::warn!(worker = %name, error = %cause, "connect failed; marked unhealthy until probes succeed");
    }
}

/// The request moves to `worker` after a failed connect, with `guard` its load there: the first
/// worker's load and telemetry end now, and the retry is counted.
pub fn retry_on(routing: &Routing, exchange: &mut Exchange, guard: LoadGuard, worker: usize) {
    routing.metrics.record_retry();
    exchange.move_to(guard, worker);
}
