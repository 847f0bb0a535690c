//! An open-loop storm at about twice capacity through gatewayd over simulated workers whose batch
//! equals the cap: the workers never queue (their running + waiting stays at the cap), every
//! answer is 200 or a clean 503, and nothing is left behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_workers};
use gatewayd::config::WorkerConfig;

use super::*;

const CAP: usize = 2;
const WORKERS: usize = 2;

/// Simulated workers with a batch of [`CAP`], four times faster than real time.
async fn workers() -> Vec<WorkerHandle> {
    let sim = SimConfig {
        max_batch: CAP,
        ..SimConfig::default().with_time_scale(0.25)
    };
    spawn_workers(WORKERS, 0, sim).await.unwrap()
}

fn chat(gateway: &RunningGateway, key: usize) -> reqwest::RequestBuilder {
    client()
        .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
        .header(ROUTING_KEY, format!("user-{}", key % 7))
        .json(&serde_json::json!({
            "model": "bch-sim",
            "messages": [{"role": "user", "content": format!("question {key}")}],
            "max_tokens": 16,
        }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_storm_at_twice_capacity_never_queues_at_the_workers() {
    let sims = workers().await;
    let mut config = test_config(&[]);
    config.workers = sims
        .iter()
        .map(|w| WorkerConfig {
            name: Some(w.name().to_owned()),
            ..WorkerConfig::from_url(&w.url())
        })
        .collect();
    config.admission.max_in_flight_per_worker = CAP as u64;
    config.admission.queue_timeout_ms = 100;
    config.admission.max_queued = 8;
    let gateway = start(config).await;

    // Capacity: CAP requests per worker, each taking about one unloaded request's time.
    let started = Instant::now();
    assert_eq!(chat(&gateway, 0).send().await.unwrap().status(), 200);
    let unloaded = started.elapsed();
    let capacity = (CAP * WORKERS) as f64 / unloaded.as_secs_f64();
    let interval = Duration::from_secs_f64(1.0 / (2.0 * capacity));

    // The workers' own gauges, sampled through the run.
    let running = AtomicBool::new(true);
    let (mut samples, mut over_cap, mut worst) = (0u64, 0u64, 0u64);
    let sample = async {
        while running.load(Ordering::SeqCst) {
            for sim in &sims {
                let now = sim.stats();
                let queued = now.running + now.waiting;
                samples += 1;
                worst = worst.max(queued);
                over_cap += u64::from(queued > CAP as u64);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    // Open loop: one request per interval, whatever is outstanding.
    let storm = async {
        let total = 200;
        let mut ticks = tokio::time::interval(interval);
        let mut requests = Vec::with_capacity(total);
        for key in 0..total {
            ticks.tick().await;
            let request = chat(&gateway, key);
            requests.push(tokio::spawn(async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                let retry_after = response.headers().contains_key("retry-after");
                drop(response.bytes().await);
                (status, retry_after)
            }));
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
    eprintln!(
        "STORM unloaded {unloaded:?}, interval {interval:?}: {ok} ok, {shed} shed; worker running+waiting \
         worst {worst}, over the cap in {over_cap} of {samples} samples"
    );
    answers.assert_clean_overload();
    // Over the cap only in the instant between a response's last byte and the worker retiring it.
    assert!(worst <= CAP as u64 + 1, "a worker queued {worst}");
    assert!(
        over_cap * 20 <= samples,
        "over the cap in {over_cap} of {samples} samples"
    );
    assert_eq!(queue_length(&gateway), 0.0);
    let loads = wait_all_idle(&gateway).await;
    assert!(loads.iter().all(|(_, n)| *n == 0), "{loads:?}");
    gateway.shutdown().await;
    for sim in sims {
        sim.shutdown().await.unwrap();
    }
}
