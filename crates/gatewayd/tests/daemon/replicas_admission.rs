//! Three real `gatewayd` replicas with `[load] source = "worker_metrics"` and a cap per worker, in
//! front of simulated workers whose batch equals the cap, under an open-loop storm at about twice
//! the fleet's capacity sent round-robin through all three (docs/overload.md, "Several replicas").
//!
//! The bound asserted (docs/replicas.md, "Admission across replicas"): a replica admits a request
//! to a worker only while `max(local, reported + local − local_at_scrape)` is under the cap, so
//! - its own in-flight requests on a worker never exceed the cap (the floor at `local`): the
//!   worker's running + waiting never exceeds replicas × cap, whatever the scrapes do;
//! - what it cannot see is what the other replicas sent since its last sample: a worker is over the
//!   cap only by requests admitted within about one scrape interval of each other, and only until
//!   the requests running then end (the replicas' next samples show the load, and they admit no more
//!   until it has dropped under the cap). With one request's service time D, a stretch over the cap
//!   lasts at most about D plus one scrape interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_workers};
use serde_json::{Value, json};

use crate::common::StormAnswers;
use crate::replicas::Replica;

const REPLICAS: usize = 3;
const WORKERS: usize = 2;
/// Requests per worker, the workers' batch and every replica's `max_in_flight_per_worker`.
const CAP: u64 = 2;
const SCRAPE_MS: u64 = 50;
/// Completion tokens per request; at 20 ms a decode step, a request takes about 400 ms.
const TOKENS: u64 = 20;

/// Workers of batch [`CAP`] whose requests take about 400 ms whatever the batch holds.
async fn workers() -> Vec<WorkerHandle> {
    let sim = SimConfig {
        max_batch: CAP as usize,
        decode_step_base_ms: 20.0,
        decode_step_per_running_ms: 0.0,
        ..SimConfig::default()
    };
    spawn_workers(WORKERS, 0, sim).await.unwrap()
}

/// One sample of a worker's own running + waiting gauge, at `at` since the storm began.
struct Sample {
    at: Duration,
    worker: usize,
    queued: u64,
}

/// Stretches over the cap per worker: (start, length).
fn stretches_over_cap(samples: &[Sample]) -> Vec<(Duration, Duration)> {
    let mut stretches = Vec::new();
    for worker in 0..WORKERS {
        let mut began = None;
        for sample in samples.iter().filter(|s| s.worker == worker) {
            match (began, sample.queued > CAP) {
                (None, true) => began = Some(sample.at),
                (Some(start), false) => {
                    stretches.push((start, sample.at - start));
                    began = None;
                }
                _ => {}
            }
        }
        if let Some(start) = began {
            stretches.push((start, samples.last().unwrap().at - start));
        }
    }
    stretches
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_metrics_replicas_keep_a_worker_under_its_cap_within_one_scrape_interval() {
    let sims = workers().await;
    let admission = format!(
        "[admission]\nmax_in_flight_per_worker = {CAP}\nqueue_timeout_ms = 200\nmax_queued = 64\n"
    );
    let replicas: Vec<Replica> = (0..REPLICAS)
        .map(|_| Replica::start_with(&sims, "worker_metrics", SCRAPE_MS, &admission))
        .collect();
    let client = bch_drill::tls::http_client().build().unwrap();
    let send = |i: usize| {
        let request = client
            .post(format!(
                "http://{}/v1/chat/completions",
                replicas[i % REPLICAS].data
            ))
            .header("x-smg-routing-key", format!("user-{}", i % 7))
            .json(&json!({
                "messages": [{"role": "user", "content": format!("question {i}")}],
                "max_tokens": TOKENS,
            }));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().contains_key("retry-after");
            drop(response.bytes().await);
            (status, retry_after)
        }
    };

    // The service time D, unloaded, through a replica.
    let started = Instant::now();
    assert_eq!(send(0).await, (200, false));
    let service = started.elapsed();
    let capacity = (CAP as usize * WORKERS) as f64 / service.as_secs_f64();
    let interval = Duration::from_secs_f64(1.0 / (2.0 * capacity));

    let running = AtomicBool::new(true);
    let mut samples = Vec::new();
    let storm_began = Instant::now();
    let sample = async {
        while running.load(Ordering::SeqCst) {
            for (worker, sim) in sims.iter().enumerate() {
                let now = sim.stats();
                samples.push(Sample {
                    at: storm_began.elapsed(),
                    worker,
                    queued: now.running + now.waiting,
                });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    // Open loop, round-robin over the replicas: one request per interval for about 3 s,
    // whatever is outstanding.
    let storm = async {
        let total = (3.0 / interval.as_secs_f64()) as usize;
        let mut ticks = tokio::time::interval(interval);
        let mut requests = Vec::with_capacity(total);
        for i in 1..=total {
            ticks.tick().await;
            requests.push(tokio::spawn(send(i)));
        }
        let mut answers = Vec::with_capacity(total);
        for request in requests {
            answers.push(request.await.unwrap());
        }
        running.store(false, Ordering::SeqCst);
        answers
    };
    let ((), answers) = tokio::join!(sample, storm);

    let answers = StormAnswers::of(answers);
    let (ok, shed) = (answers.ok, answers.shed);
    let worst = samples.iter().map(|s| s.queued).max().unwrap_or(0);
    let over = samples.iter().filter(|s| s.queued > CAP).count();
    let stretches = stretches_over_cap(&samples);
    let longest = stretches
        .iter()
        .map(|(_, length)| *length)
        .max()
        .unwrap_or_default();
    eprintln!(
        "REPLICAS service {service:?}, interval {interval:?}: {ok} ok, {shed} shed; worker \
         running+waiting worst {worst}, over the cap in {over} of {} samples, {} stretches, \
         longest {longest:?}",
        samples.len(),
        stretches.len()
    );
    answers.assert_clean_overload();
    // Each replica alone never puts more than the cap on a worker.
    assert!(
        worst <= REPLICAS as u64 * CAP,
        "a worker held {worst} requests, over {REPLICAS} replicas × {CAP}"
    );
    // Over the cap only until the requests running then end, once a scrape showed the load. The
    // slack covers a scrape and a decode step delayed on a busy machine.
    let scrape = Duration::from_millis(SCRAPE_MS);
    let bound = service + scrape + scrape + Duration::from_millis(100);
    assert!(
        longest <= bound,
        "a worker stayed over its cap for {longest:?} (bound {bound:?}): {stretches:?}"
    );

    // Nothing is left behind: every replica's counters and every worker's gauges return to 0.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut records: Vec<Value> = Vec::new();
        for replica in &replicas {
            records.extend(
                replica.get("/admin/workers").await["workers"]
                    .as_array()
                    .unwrap()
                    .clone(),
            );
        }
        let zero = |r: &Value, field: &str| r.get(field).is_none_or(|v| v == 0);
        let mut queued = 0.0;
        for replica in &replicas {
            let metrics = bch_drill::tls::get(format!("http://{}/metrics", replica.control))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            queued += metrics
                .lines()
                .find_map(|l| l.strip_prefix("bch_admission_queue_length ")?.parse().ok())
                .unwrap_or(0.0);
        }
        let sims_idle = sims
            .iter()
            .all(|w| w.stats().running == 0 && w.stats().waiting == 0);
        if sims_idle
            && queued == 0.0
            && records
                .iter()
                .all(|r| zero(r, "active") && zero(r, "load") && zero(r, "reported_load"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not idle: {queued} queued, records {records:#?}"
        );
        // The replicas' counters are read over HTTP and the reports need a scrape to reach 0.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
