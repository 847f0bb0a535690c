//! Simulated worker over real HTTP on 127.0.0.1. Timing tests run on paused tokio time, so simulated
//! durations are measured exactly and nothing sleeps for real.

use std::net::SocketAddr;
use std::time::Duration;

use bch_drill::sim::{SimConfig, filler_text};
use bch_drill::worker::{Fault, WorkerHandle, spawn_worker};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::time::Instant;

async fn worker(config: SimConfig) -> WorkerHandle {
    spawn_worker(SocketAddr::from(([127, 0, 0, 1], 0)), "w", config)
        .await
        .unwrap()
}

/// A streamed chat completion: time to the first `data:` frame, total time, and the frames.
struct Streamed {
    ttft: Duration,
    total: Duration,
    frames: Vec<String>,
}

impl Streamed {
    fn content(&self) -> String {
        self.frames
            .iter()
            .filter(|f| *f != "[DONE]")
            .filter_map(|f| {
                let v: Value = serde_json::from_str(f).unwrap();
                v.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }

    fn usage(&self) -> Value {
        let usage = self.frames.iter().rev().find_map(|f| {
            serde_json::from_str::<Value>(f)
                .ok()
                .and_then(|v| v.get("usage").cloned())
        });
        usage.expect("a usage chunk")
    }
}

async fn stream_chat(url: &str, prompt: &str, max_tokens: u32) -> Streamed {
    let client = bch_drill::tls::http_client().build().unwrap();
    let start = Instant::now();
    let response = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({
            "model": "bch-sim",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut ttft = None;
    while let Some(chunk) = body.next().await {
        buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        if ttft.is_none() && buffer.contains("data: ") {
            ttft = Some(start.elapsed());
        }
    }
    let total = start.elapsed();
    let frames = buffer
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            f.strip_prefix("data: ")
                .expect("every frame is a data line")
                .to_owned()
        })
        .collect();
    Streamed {
        ttft: ttft.expect("at least one frame"),
        total,
        frames,
    }
}

async fn chat(url: &str, prompt: &str, max_tokens: u32) -> (reqwest::StatusCode, Value) {
    let response = bch_drill::tls::http_client()
        .build()
        .unwrap()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_cached_prefix_lowers_ttft() {
    let w = worker(SimConfig::default()).await;
    let prompt = filler_text(1, 1024);

    let cold = stream_chat(&w.url(), &prompt, 4).await;
    assert_eq!(cold.usage()["prompt_tokens"], 1024);
    assert_eq!(cold.usage()["prompt_tokens_details"]["cached_tokens"], 0);
    // One engine step: 10 ms + 1024 tokens at 10,000 tokens/s.
    assert!(
        cold.ttft >= Duration::from_micros(112_400) && cold.ttft < Duration::from_micros(113_400),
        "cold TTFT {:?}",
        cold.ttft
    );

    let warm = stream_chat(&w.url(), &prompt, 4).await;
    // 63 full blocks of 16 within the first 1023 tokens; 16 tokens left: 10 ms + 1.6 ms.
    assert_eq!(warm.usage()["prompt_tokens_details"]["cached_tokens"], 1008);
    assert!(
        warm.ttft >= Duration::from_micros(11_600) && warm.ttft < Duration::from_micros(12_600),
        "warm TTFT {:?}",
        warm.ttft
    );
    assert!(warm.ttft < cold.ttft);

    let stats = w.stats();
    assert_eq!(stats.cached_tokens_total, 1008);
    assert_eq!(stats.prompt_tokens_total, 2048);
    assert_eq!((stats.running, stats.waiting), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_stream_ends_with_usage_then_done_and_matches_the_non_streamed_answer() {
    let w = worker(SimConfig::default()).await;
    let streamed = stream_chat(&w.url(), "tell me about rings", 7).await;
    assert_eq!(streamed.frames.last().unwrap(), "[DONE]");
    let usage = streamed.usage();
    assert_eq!(usage["completion_tokens"], 7);
    // tell, me, abou, t, ring, s
    assert_eq!(usage["prompt_tokens"], 6);
    let first: Value = serde_json::from_str(&streamed.frames[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");

    let (status, full) = chat(&w.url(), "tell me about rings", 7).await;
    assert_eq!(status, 200);
    assert_eq!(full["choices"][0]["message"]["content"], streamed.content());
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(full["usage"]["completion_tokens"], 7);
    assert_eq!(full["usage"]["total_tokens"], 13);
}

#[tokio::test(start_paused = true)]
async fn output_is_deterministic_for_a_seed() {
    let a = worker(SimConfig {
        seed: 5,
        ..SimConfig::default()
    })
    .await;
    let b = worker(SimConfig {
        seed: 5,
        ..SimConfig::default()
    })
    .await;
    let c = worker(SimConfig {
        seed: 6,
        ..SimConfig::default()
    })
    .await;
    let text = |v: Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let from_a = text(chat(&a.url(), "same prompt", 24).await.1);
    assert_eq!(from_a.split(' ').count(), 24);
    assert_eq!(from_a, text(chat(&a.url(), "same prompt", 24).await.1));
    assert_eq!(from_a, text(chat(&b.url(), "same prompt", 24).await.1));
    assert_ne!(from_a, text(chat(&c.url(), "same prompt", 24).await.1));
    assert_ne!(from_a, text(chat(&a.url(), "other prompt", 24).await.1));
}

#[tokio::test(start_paused = true)]
async fn a_running_batch_slows_decode() {
    let w = worker(SimConfig::default()).await;
    let alone = stream_chat(&w.url(), "solo", 20).await;
    let decode_alone = alone.total - alone.ttft;
    // 19 steps of 10 ms.
    assert!(
        decode_alone >= Duration::from_millis(190),
        "{decode_alone:?}"
    );

    let prompts: Vec<String> = (0..8).map(|i| format!("sibling {i}")).collect();
    let url = w.url();
    let runs =
        futures_util::future::join_all(prompts.iter().map(|p| stream_chat(&url, p, 20))).await;
    // Eight decoding together: 19 steps of 10 ms + 7 × 0.1 ms (less 1 ms: tokio's timers fire on
    // whole milliseconds, so the two ends of the span are rounded).
    for run in runs {
        let decode = run.total - run.ttft;
        assert!(
            decode >= Duration::from_micros(19 * 10_700 - 1_000),
            "{decode:?} vs {decode_alone:?}"
        );
    }
}

/// Arrival time of every SSE frame of a streamed chat completion, from just before it is sent.
async fn frame_times(url: &str, prompt: &str, max_tokens: u32) -> Vec<Duration> {
    let start = Instant::now();
    let response = bch_drill::tls::http_client()
        .build()
        .unwrap()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut times = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        let frames = std::str::from_utf8(&chunk)
            .unwrap()
            .matches("data: ")
            .count();
        times.extend(std::iter::repeat_n(start.elapsed(), frames));
    }
    times
}

#[tokio::test(start_paused = true)]
async fn concurrent_prefills_share_the_prefill_throughput() {
    let w = worker(SimConfig::default()).await;
    let url = w.url();
    let alone = stream_chat(&url, &filler_text(100, 1024), 1).await;
    // Eight cold 1,024-token prompts at once: 8,192 tokens of prefill at 10,000 tokens/s, four
    // steps of a 2,048-token budget, so the last first token comes after at least 819 ms of prefill
    // (plus a step overhead each), where one prompt alone took 112 ms.
    let prompts: Vec<String> = (0..8).map(|i| filler_text(200 + i, 1024)).collect();
    let runs =
        futures_util::future::join_all(prompts.iter().map(|p| stream_chat(&url, p, 1))).await;
    let last = runs.iter().map(|r| r.ttft).max().unwrap();
    let first = runs.iter().map(|r| r.ttft).min().unwrap();
    assert!(
        last >= Duration::from_micros(819_200 + 4 * 10_000),
        "last TTFT {last:?}"
    );
    // The first two share the first step's budget: each waits for both.
    assert!(
        first >= Duration::from_micros(214_800),
        "first TTFT {first:?}"
    );
    assert!(first > alone.ttft);
}

#[tokio::test(start_paused = true)]
async fn a_prefill_chunk_delays_the_running_decodes() {
    let w = worker(SimConfig::default()).await;
    let url = w.url();
    let decoding = tokio::spawn({
        let url = url.clone();
        async move { frame_times(&url, "keep talking", 40).await }
    });
    // Let it decode a few steps, then a cold 2,048-token prompt fills one whole step budget
    // (2,047 prefill tokens beside the one decode, then 1 more).
    tokio::time::sleep(Duration::from_millis(55)).await;
    let cold = stream_chat(&url, &filler_text(300, 2048), 1).await;
    let times = decoding.await.unwrap();
    let widest = times
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .max()
        .unwrap();
    // Steps of a lone decode are 10 ms; the step carrying the chunk is 10.1 + 204.7 ms (less the
    // 1 ms of timer rounding).
    assert!(
        widest >= Duration::from_micros(213_800),
        "widest gap between tokens {widest:?}"
    );
    assert!(
        cold.ttft >= Duration::from_micros(214_800),
        "{:?}",
        cold.ttft
    );
}

#[tokio::test(start_paused = true)]
async fn a_long_prompt_is_prefilled_in_chunks() {
    let w = worker(SimConfig::default()).await;
    // 5,000 tokens: steps of 2,048, 2,048 and 904 tokens, 10 ms each on top of 500 ms of prefill.
    let run = stream_chat(&w.url(), &filler_text(400, 5000), 2).await;
    assert!(
        run.ttft >= Duration::from_micros(530_000) && run.ttft < Duration::from_micros(531_000),
        "{:?}",
        run.ttft
    );
}

#[tokio::test(start_paused = true)]
async fn siblings_wait_for_a_shared_prefix_then_hit_it() {
    let w = worker(SimConfig::default()).await;
    let url = w.url();
    let prefix = filler_text(500, 1024);
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("{prefix}\n{}", filler_text(600 + i, 32)))
        .collect();
    let runs =
        futures_util::future::join_all(prompts.iter().map(|p| stream_chat(&url, p, 2))).await;
    let mut cached: Vec<u64> = runs
        .iter()
        .map(|r| {
            r.usage()["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect();
    cached.sort_unstable();
    // One sibling computes the prefix; the seven others wait for it and hit its 64 blocks.
    assert_eq!(cached, [0, 1024, 1024, 1024, 1024, 1024, 1024, 1024]);
    let stats = w.stats();
    assert_eq!(stats.cached_tokens_total, 7 * 1024);
}

#[tokio::test(start_paused = true)]
async fn requests_beyond_max_batch_wait_in_fifo_order() {
    let w = worker(SimConfig {
        max_batch: 1,
        ..SimConfig::default()
    })
    .await;
    let url = w.url();
    let first = tokio::spawn({
        let url = url.clone();
        async move { stream_chat(&url, "first", 10).await }
    });
    // The second request must not be sent before the first holds the batch slot.
    while w.stats().running == 0 {
        tokio::task::yield_now().await;
    }
    let second = stream_chat(&url, "second", 10).await;
    let first = first.await.unwrap();
    assert!(
        second.ttft >= first.total - Duration::from_millis(1),
        "{:?} {:?}",
        second.ttft,
        first.total
    );
}

#[tokio::test(start_paused = true)]
async fn instant_mode_arms_no_timer() {
    let w = worker(SimConfig::default().with_time_scale(0.0)).await;
    let start = Instant::now();
    let run = stream_chat(&w.url(), &filler_text(3, 4096), 64).await;
    // Paused time only moves when a timer is due; instant mode never arms one.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(run.usage()["completion_tokens"], 64);
}

#[tokio::test(start_paused = true)]
async fn fault_500_answers_errors_until_cleared() {
    let w = worker(SimConfig::default()).await;
    w.set_fault(Fault::Status500);
    let (status, body) = chat(&w.url(), "x", 1).await;
    assert_eq!(status, 500);
    assert_eq!(body["error"]["code"], 500);
    let health = bch_drill::tls::get(format!("{}/health", w.url()))
        .await
        .unwrap();
    assert_eq!(health.status(), 500);

    w.set_fault(Fault::None);
    assert_eq!(chat(&w.url(), "x", 1).await.0, 200);
    assert_eq!(
        bch_drill::tls::get(format!("{}/health", w.url()))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(w.stats().requests_total, 2);
}

#[tokio::test(start_paused = true)]
async fn stall_holds_the_first_byte_until_cleared() {
    let w = worker(SimConfig::default()).await;
    w.set_fault(Fault::StallFirstByte);
    let url = w.url();
    let mut request = Box::pin(chat(&url, "x", 2));
    // Unstalled, this answers after ~11 ms of simulated time; a minute passes with nothing.
    let waited = tokio::time::timeout(Duration::from_secs(60), &mut request).await;
    assert!(waited.is_err(), "a stalled worker answered");
    // The worker is alive meanwhile.
    assert_eq!(
        bch_drill::tls::get(format!("{url}/health"))
            .await
            .unwrap()
            .status(),
        200
    );

    w.set_fault(Fault::None);
    let (status, body) = request.await;
    assert_eq!(status, 200);
    assert_eq!(body["usage"]["completion_tokens"], 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_stalled_requests() {
    let w = worker(SimConfig::default()).await;
    w.set_fault(Fault::StallFirstByte);
    let url = w.url();
    let request = tokio::spawn(async move { chat(&url, "x", 2).await.0 });
    while w.stats().requests_total == 0 {
        tokio::task::yield_now().await;
    }
    w.shutdown().await.unwrap();
    assert_eq!(request.await.unwrap(), 503);
}

#[tokio::test(start_paused = true)]
async fn completions_and_sglang_generate_report_usage() {
    let w = worker(SimConfig::default()).await;
    let client = bch_drill::tls::http_client().build().unwrap();
    let v: Value = client
        .post(format!("{}/v1/completions", w.url()))
        .json(&json!({"prompt": "once upon a time", "max_tokens": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(
        v["choices"][0]["text"].as_str().unwrap().split(' ').count(),
        3
    );

    let v: Value = client
        .post(format!("{}/generate", w.url()))
        .json(&json!({"text": "once upon a time", "sampling_params": {"max_new_tokens": 5}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["meta_info"]["completion_tokens"], 5);
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "length");

    let body = client
        .post(format!("{}/generate", w.url()))
        .json(&json!({"text": "once upon a time", "sampling_params": {"max_new_tokens": 5}, "stream": true}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"));
    let frames: Vec<&str> = body.split("\n\n").filter(|f| !f.is_empty()).collect();
    let last: Value =
        serde_json::from_str(frames[frames.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
    // SGLang streams cumulative text; the last frame carries the whole completion.
    assert_eq!(last["text"], v["text"]);
    assert_eq!(last["meta_info"]["cached_tokens"], 0);
}

#[tokio::test(start_paused = true)]
async fn models_and_metrics_are_served() {
    let w = worker(SimConfig::default()).await;
    let models: Value = bch_drill::tls::get(format!("{}/v1/models", w.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "bch-sim");

    let prompt = filler_text(2, 64);
    chat(&w.url(), &prompt, 1).await;
    chat(&w.url(), &prompt, 1).await;
    let text = bch_drill::tls::get(format!("{}/metrics", w.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "vllm:num_requests_running 0",
        "vllm:num_requests_waiting 0",
        "vllm:prompt_tokens_total 128",
        "vllm:prefix_cache_hits_total 48",
        "vllm:request_success_total 2",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[tokio::test]
async fn bad_json_is_a_400_in_openai_shape() {
    let w = worker(SimConfig::default().with_time_scale(0.0)).await;
    let response = bch_drill::tls::http_client()
        .build()
        .unwrap()
        .post(format!("{}/v1/chat/completions", w.url()))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let v: Value = response.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid JSON")
    );
}

/// Streams on a keep-alive connection do not wait for the client's delayed ACK: the worker sets
/// TCP_NODELAY. With Nagle, every stream after the first stalls ~40 ms on its last small chunks.
#[tokio::test]
async fn keep_alive_streams_are_not_delayed_by_nagle() {
    let w = worker(SimConfig::default().with_time_scale(0.0)).await;
    let client = bch_drill::tls::http_client().build().unwrap();
    let url = format!("{}/v1/chat/completions", w.url());
    let body = json!({"messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 62, "stream": true});
    let started = Instant::now();
    for _ in 0..10 {
        let response = client.post(&url).json(&body).send().await.unwrap();
        assert!(response.status().is_success());
        let bytes = response.bytes().await.unwrap();
        assert!(bytes.ends_with(b"data: [DONE]\n\n"));
    }
    // Ten instant streams take a few ms; with Nagle they took over 400 ms (>= 40 ms each after
    // the first).
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(300), "{elapsed:?}");
}

/// Opens one held chat stream per prompt on `w` (each asks for 100 tokens), all answered 200; the
/// requests stay in the engine until their responses are dropped.
async fn hold_streams(
    w: &WorkerHandle,
    prompts: impl IntoIterator<Item = String>,
) -> Vec<reqwest::Response> {
    let client = bch_drill::tls::http_client().build().unwrap();
    let mut held = Vec::new();
    for prompt in prompts {
        let response = client
            .post(format!("{}/v1/chat/completions", w.url()))
            .json(&json!({
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 100,
                "stream": true,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    held
}

/// The worker's engine gauges from its `/metrics`: (running, waiting, KV usage); NaN for one it
/// does not show.
async fn engine_gauges(w: &WorkerHandle) -> (f64, f64, f64) {
    let text = bch_drill::tls::get(format!("{}/metrics", w.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (
        value("vllm:num_requests_running "),
        value("vllm:num_requests_waiting "),
        value("vllm:kv_cache_usage_perc "),
    )
}

/// Polls (bounded) until the worker's gauges read `expected` (running, waiting); answers the KV
/// usage they read with.
async fn until_gauges(w: &WorkerHandle, expected: (f64, f64)) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (running, waiting, kv) = engine_gauges(w).await;
        if (running, waiting) == expected {
            return kv;
        }
        assert!(
            Instant::now() < deadline,
            "gauges ({running}, {waiting}), expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The two gauges a gateway scrapes for fleet-wide load (docs/replicas.md) count every request in
/// the engine: held streams in the batch as running, the ones beyond `max_batch` as waiting, and
/// both go back to 0 when the clients abort.
#[tokio::test]
async fn held_streams_are_reported_as_running_plus_waiting() {
    let w = worker(SimConfig {
        max_batch: 2,
        decode_step_base_ms: 1_000.0,
        ..SimConfig::default()
    })
    .await;
    let held = hold_streams(&w, (0..3).map(|i| format!("held {i}"))).await;
    until_gauges(&w, (2.0, 1.0)).await;
    drop(held);
    until_gauges(&w, (0.0, 0.0)).await;
    assert_eq!((w.stats().running, w.stats().waiting), (0, 0));
}

/// Under a known load the gauges are exact, as a gateway's overload checks need them: five held
/// streams on a batch of two are two running and three waiting, running + waiting follows every
/// client that leaves (a waiting one leaving the queue, a running one handing its slot to the
/// next), and KV usage is above 0 while requests run and back to 0 after.
#[tokio::test]
async fn the_gauges_follow_a_known_load_exactly() {
    let w = worker(SimConfig {
        max_batch: 2,
        decode_step_base_ms: 1_000.0,
        ..SimConfig::default()
    })
    .await;
    let mut held = hold_streams(&w, (0..5).map(|i| filler_text(i, 64))).await;
    // 64-token prompts of 16-token blocks plus the first token: 5 blocks each, of 4096.
    let kv = until_gauges(&w, (2.0, 3.0)).await;
    assert!(kv > 0.0 && kv <= 10.0 / 4096.0 + 1e-9, "{kv}");
    drop(held.pop());
    until_gauges(&w, (2.0, 2.0)).await;
    drop(held.remove(0));
    until_gauges(&w, (2.0, 1.0)).await;
    drop(held);
    assert_eq!(until_gauges(&w, (0.0, 0.0)).await, 0.0);
    assert_eq!((w.stats().running, w.stats().waiting), (0, 0));
}
