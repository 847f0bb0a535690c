//! One source's task: resolve, parse, apply the safety rules, hand the set to the admin owner,
//! wait for the next refresh; until stopped (shutdown, or a reload that changed or removed the
//! source).
//!
//! Nothing here runs on the data path. The admin owner's apply (merge, endpoints, a ring rebuild
//! for a thousand workers) is CPU work of a few milliseconds, so it runs on a blocking thread,
//! never on a runtime thread that also drives requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::counters::SourceCounters;
use super::records::{FailedLookup, FailureKind, Parsed, parse};
use super::resolve::{Resolution, SourceResolver};
use super::safety::{Event, Observation, Safety, next_refresh};
use crate::admin::{Admin, DiscoveredWorker, DiscoveryChange, ResolutionOutcome, StateChange};
use crate::clock::now_ms;
use crate::config::DiscoveryConfig;
use crate::log_limit::{Component, LimitedLog, LineBudget, SuppressedLines};

/// URLs named in one membership-change log line; the rest are counted.
const URLS_LOGGED: usize = 8;

/// Runs `source` until `stop` is cancelled; its state-change lines beyond the `[log]` budget
/// are counted in `suppressed`.
pub async fn run(
    admin: Arc<Admin>,
    source: DiscoveryConfig,
    counters: Arc<SourceCounters>,
    suppressed: Arc<SuppressedLines>,
    stop: CancellationToken,
) {
    let interval = source.interval;
    let label = source.source().label().into_owned();
    let mut resolver = None;
    let kept = admin.discovered_count(&source);
    let mut safety = Safety::new(source.empty_after, kept);
    let mut skipped: Vec<String> = Vec::new();
    let server = source
        .resolver
        .map_or_else(|| "system".to_owned(), |r| r.to_string());
    let mut failed_lookups: Vec<String> = Vec::new();
    // One budget for every state-change line of this source: a name flapping every 100 ms
    // writes a few lines per period and a summary, not a line per change. `[log]` takes effect
    // at a restart, like the rest of the section.
    let budget = LineBudget::of(&admin.config().load().log);
    let mut lines = LimitedLog::new(Component::Discovery, budget, suppressed);
    tracing::info!(source = %label, interval_ms = crate::config::millis::as_millis(interval), resolver = %server, "discovery started");
    admin.discovery_started(&source);
    loop {
        let (observation, ttl, failed, failure) =
            resolve_once(&source, &mut resolver, &mut skipped, &mut lines).await;
        counters.record_refresh();
        if let Some(kind) = failure {
            counters.record_error(kind);
        }
        // Without an answer (a failed resolution, NXDOMAIN) nothing is known of either family:
        // the refusals logged before are neither over nor news when the answers come back.
        if let Some(failed) = &failed {
            for lookup in failed {
                counters.record_lookup_error(lookup.family);
            }
            log_failed_lookups(&label, failed, &mut failed_lookups, &mut lines);
        }
        let outcome = match &observation {
            Observation::Workers(_) => ResolutionOutcome::Workers {
                lookup_error: failed.iter().flatten().next().map(ToString::to_string),
            },
            Observation::Empty(why) => ResolutionOutcome::Empty(why.clone()),
            Observation::Failed(why) => ResolutionOutcome::Failed(why.clone()),
        };
        let state = describe(&outcome);
        let verdict = safety.observe(observation, Instant::now());
        for event in &verdict.events {
            if lines.admit(&(), &label, Instant::now()) {
                log_event(&label, event);
            }
        }
        if let Some(workers) = verdict.apply {
            apply(&admin, &source, &label, workers, &mut lines).await;
        }
        if let Some(change) = admin.record_resolution(&source, outcome, now_ms())
            && lines.admit(&(), &label, Instant::now())
        {
            log_state_change(&label, &change);
        }
        // After the apply: the merge decides which of the set's workers could not join (one
        // that is this gateway's own listener would loop), and those are skipped records too.
        counters.set_skipped_records(skipped.len() + admin.merge_skipped(&source));
        lines.flush(Instant::now(), |()| (label.clone(), Some(state.clone())));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(next_refresh(interval, ttl)) => {}
        }
    }
    tracing::info!(source = %label, "discovery stopped");
}

/// One resolution and what the rules see in it, with the answer's TTL, when the server
/// answered, the lookups of one address family that failed while the other answered, and when
/// the resolution failed, what kind of failure it was. Builds the
/// resolver the first time (and again after that failed); warns about skipped records when their
/// list changes.
async fn resolve_once(
    source: &DiscoveryConfig,
    resolver: &mut Option<SourceResolver>,
    skipped: &mut Vec<String>,
    lines: &mut LimitedLog<()>,
) -> Resolved {
    if resolver.is_none() {
        match SourceResolver::new(source) {
            Ok(built) => *resolver = Some(built),
            Err(why) => {
                return (
                    Observation::Failed(why),
                    None,
                    None,
                    Some(FailureKind::Error),
                );
            }
        }
    }
    let resolver = resolver.as_ref().expect("built above");
    match resolver.resolve().await {
        Resolution::Answer(answer) => {
            let Parsed {
                workers,
                skipped: now,
            } = parse(source, &answer);
            // A changed list of skipped records is one state change, however many records.
            let label = source.source().label().into_owned();
            if now != *skipped && lines.admit(&(), &label, Instant::now()) {
                for reason in &now {
                    tracing::warn!(source = %source.source(), "bad record skipped: {reason}");
                }
            }
            *skipped = now;
            let observation = if workers.is_empty() {
                Observation::Empty("every record was skipped".into())
            } else {
                Observation::Workers(workers)
            };
            (observation, answer.ttl, Some(answer.failed_lookups), None)
        }
        Resolution::Empty(why) => (Observation::Empty(why), None, None, None),
        Resolution::Failed(kind, why) => (Observation::Failed(why), None, None, Some(kind)),
    }
}

/// What [`resolve_once`] answers: the observation, the TTL, the failed lookups of one family,
/// and the kind of a failed resolution.
type Resolved = (
    Observation,
    Option<Duration>,
    Option<Vec<FailedLookup>>,
    Option<FailureKind>,
);

/// Warns about lookups of one address family that failed while the other answered, when their
/// list changes (not on every refresh: dnsmasq without upstream servers refuses every AAAA query).
fn log_failed_lookups(
    label: &str,
    failed: &[FailedLookup],
    logged: &mut Vec<String>,
    lines: &mut LimitedLog<()>,
) {
    let mut now: Vec<String> = failed.iter().map(ToString::to_string).collect();
    now.sort();
    if now == *logged {
        return;
    }
    if !lines.admit(&(), label, Instant::now()) {
        *logged = now;
        return;
    }
    for lookup in now.iter().filter(|l| !logged.contains(l)) {
        tracing::warn!(source = %label, "address lookup failed, the other family answered: {lookup}; counted in bch_discovery_lookup_errors_total");
    }
    if now.is_empty() {
        tracing::info!(source = %label, "address lookups of both families answer again");
    }
    *logged = now;
}

/// One line per state change of a source (`ok`, `failing`, `empty`), not one per refresh.
fn log_state_change(label: &str, change: &StateChange) {
    let (from, to) = (change.from.as_str(), change.to.as_str());
    match &change.reason {
        Some(reason) => {
            tracing::warn!(source = %label, from, to, "discovery source is {to} (was {from}): {reason}")
        }
        None => tracing::info!(source = %label, from, to, "discovery source is {to} (was {from})"),
    }
}

/// Hands `workers` to the admin owner on a blocking thread and logs what changed.
async fn apply(
    admin: &Arc<Admin>,
    source: &DiscoveryConfig,
    label: &str,
    workers: Vec<DiscoveredWorker>,
    lines: &mut LimitedLog<()>,
) {
    let count = workers.len();
    let (owner, entry) = (Arc::clone(admin), source.clone());
    let applied =
        tokio::task::spawn_blocking(move || owner.apply_discovered(&entry, workers)).await;
    match applied {
        // The set changed but no URL did (its workers are static ones too): nothing to tell.
        Ok(Ok(DiscoveryChange::Changed { joined, left }))
            if joined.is_empty() && left.is_empty() =>
        {
            tracing::debug!(source = %label, workers = count, "discovered set changed, membership did not");
        }
        Ok(Ok(DiscoveryChange::Changed { .. })) if !lines.admit(&(), label, Instant::now()) => {}
        Ok(Ok(DiscoveryChange::Changed { joined, left })) => tracing::info!(
            source = %label,
            workers = count,
            joined = joined.len(),
            left = left.len(),
            "discovered workers changed: joined {}; left {}",
            listed(&joined),
            listed(&left)
        ),
        Ok(Ok(DiscoveryChange::Unchanged | DiscoveryChange::NotInForce)) => {}
        Ok(Err(error)) => tracing::error!(source = %label, "discovered workers refused: {error}"),
        Err(error) => {
            tracing::error!(source = %label, "applying discovered workers failed: {error}")
        }
    }
}

/// A resolution's outcome in words, for the summary of suppressed lines.
fn describe(outcome: &ResolutionOutcome) -> String {
    match outcome {
        ResolutionOutcome::Workers { .. } => "answering with workers".to_owned(),
        ResolutionOutcome::Empty(why) => format!("answering empty ({why})"),
        ResolutionOutcome::Failed(why) => format!("failing ({why})"),
    }
}

/// At most [`URLS_LOGGED`] URLs, then how many more.
fn listed(urls: &[String]) -> String {
    if urls.is_empty() {
        return "none".into();
    }
    let shown = urls[..urls.len().min(URLS_LOGGED)].join(", ");
    match urls.len().saturating_sub(URLS_LOGGED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

fn log_event(label: &str, event: &Event) {
    match event {
        Event::OutageBegan { reason, kept } => tracing::warn!(
            source = %label,
            kept,
            "DNS resolution failed: {reason}; keeping the last good set of {kept} workers until it answers again"
        ),
        Event::OutageEnded { failures, lasted } => tracing::info!(
            source = %label,
            failures,
            lasted_ms = lasted.as_millis() as u64,
            "DNS answers again after {failures} failed resolutions"
        ),
        Event::EmptyBegan {
            reason,
            kept,
            empty_after,
        } => tracing::warn!(
            source = %label,
            kept,
            empty_after_ms = empty_after.as_millis() as u64,
            "DNS answer is empty ({reason}); keeping {kept} workers unless it stays empty for empty_after_ms"
        ),
        Event::Emptied { removed, lasted } => tracing::warn!(
            source = %label,
            removed,
            lasted_ms = lasted.as_millis() as u64,
            "DNS answer stayed empty: the source's {removed} workers are removed"
        ),
        Event::RecordsBack => tracing::info!(source = %label, "DNS answer has records again"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_url_lists_are_cut_and_counted() {
        let urls: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
        assert_eq!(listed(&urls), "u0, u1, u2, u3, u4, u5, u6, u7 and 2 more");
        assert_eq!(listed(&urls[..1]), "u0");
        assert_eq!(listed(&[]), "none");
    }
}
