//! Firing an open-loop storm: one request per scheduled arrival ([`OpenLoop::schedule`]), sent at
//! its time whatever is outstanding, so the generator can push a fleet past what it serves.
//!
//! Nothing caps the requests in flight: each is its own task with its own connection. Past the
//! process's open-file limit (`ulimit -n`) or the machine's ephemeral ports, connections fail and
//! those requests are counted as transport errors, with the cause among the report's error
//! samples; the peak in flight is reported so a run can be judged against those limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use indicatif::ProgressBar;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::arrivals::OpenLoop;
use super::config::StormConfig;
use super::prompts::Prompts;
use super::shooter::{Outcome, Shooter};

/// What an open-loop firing produced: every request's outcome with its key index (in send
/// order), and what the sending itself looked like.
pub(super) struct OpenLoopRun {
    pub(super) outcomes: Vec<(usize, Outcome)>,
    /// From the start to the last send (or to the scheduled end, whichever is later): the window
    /// over which the achieved rate and goodput are measured.
    pub(super) window: Duration,
    /// Most requests in flight at once.
    pub(super) peak_in_flight: usize,
}

/// Sends one request per arrival of `open_loop`'s schedule, key [`StormConfig::key_of`] of the
/// arrival's index, each at `start` plus its offset; stops sending when `stop` fires; then waits
/// for every answer (a stopped shooter abandons them at once).
pub(super) async fn fire_open_loop(
    config: &StormConfig,
    open_loop: &OpenLoop,
    shooter: Arc<Shooter>,
    prompts: &Prompts,
    keys: &[String],
    progress: &ProgressBar,
    stop: &CancellationToken,
) -> OpenLoopRun {
    let schedule = open_loop.schedule(config.seed);
    progress.set_length(schedule.len() as u64);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    for (index, offset) in schedule.into_iter().enumerate() {
        let due = start + offset;
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = stop.cancelled() => break,
        }
        let key = config.key_of(index);
        let prompt = prompts
            .group(key, index, 1)
            .pop()
            .expect("one prompt per request");
        let key_name = keys[key].clone();
        let shooter = shooter.clone();
        let (in_flight, peak) = (in_flight.clone(), peak.clone());
        tasks.spawn(async move {
            let late = Instant::now().saturating_duration_since(due);
            let now = in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            peak.fetch_max(now, Ordering::Relaxed);
            let mut outcome = shooter.fire(&key_name, &prompt).await;
            in_flight.fetch_sub(1, Ordering::Relaxed);
            outcome.late = Some(late);
            (index, key, outcome)
        });
        progress.inc(1);
    }
    // A stopped storm sent over the time it ran; a late machine over the time it took.
    let window = if stop.is_cancelled() {
        start.elapsed()
    } else {
        start.elapsed().max(open_loop.duration)
    };
    let mut outcomes = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        // A request task cannot panic short of a bug; such a request is lost from the report.
        if let Ok(done) = joined {
            outcomes.push(done);
        }
    }
    outcomes.sort_by_key(|(index, _, _)| *index);
    OpenLoopRun {
        outcomes: outcomes
            .into_iter()
            .map(|(_, key, outcome)| (key, outcome))
            .collect(),
        window,
        peak_in_flight: peak.load(Ordering::Relaxed),
    }
}
