//! `/metrics`: the documented families, and requests counted.

use crate::common::*;

use super::*;

#[tokio::test]
async fn metrics_have_the_design_families_and_count_requests() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let before = scrape(&gateway).await;
    for (family, kind) in [
        ("bch_branch", "counter"),
        ("bch_worker_active", "gauge"),
        ("bch_worker_requests", "counter"),
        ("bch_worker_spilled_in", "counter"),
        ("bch_worker_spilled_out", "counter"),
        ("bch_worker_healthy", "gauge"),
        ("bch_worker_errors", "counter"),
        ("bch_request_duration_seconds", "histogram"),
        ("bch_response_headers_seconds", "histogram"),
        ("bch_time_to_first_token_seconds", "histogram"),
        ("bch_worker_request_duration_seconds", "histogram"),
        ("bch_responses", "counter"),
        ("bch_worker_draining", "gauge"),
        ("bch_worker_health_changes", "counter"),
        ("bch_probe_failures", "counter"),
        ("bch_build_info", "gauge"),
        ("bch_policy_kind", "gauge"),
        ("bch_policy_min_load_gap", "gauge"),
        ("bch_policy_max_load_skew", "gauge"),
        ("bch_policy_spill_order", "gauge"),
        ("bch_load_source", "gauge"),
    ] {
        assert!(
            before.contains(&format!("# TYPE {family} {kind}\n")),
            "{family} {kind} missing:\n{before}"
        );
    }
    for worker in ["a", "b"] {
        let label = format!("worker=\"{worker}\"");
        for name in [
            "bch_worker_requests_total",
            "bch_worker_spilled_in_total",
            "bch_worker_spilled_out_total",
            "bch_worker_errors_total",
            "bch_worker_active",
        ] {
            assert_eq!(sample(&before, name, &label), Some(0.0), "{name} {worker}");
        }
        assert_eq!(sample(&before, "bch_worker_healthy", &label), Some(1.0));
        for reason in ["refused", "timeout", "status", "error"] {
            assert_eq!(
                sample(
                    &before,
                    "bch_probe_failures_total",
                    &format!("{label},reason=\"{reason}\"")
                ),
                Some(0.0),
                "probe failures ({reason}) of {worker}: the series exists before the first failure"
            );
        }
    }
    let branch = |text: &str, b: &str| {
        sample(text, "bch_branch_total", &format!("branch=\"{b}\"")).unwrap_or(-1.0)
    };
    assert_eq!(branch(&before, "explicit_routing_key_hit"), 0.0);

    let client = client();
    let send = |header: Option<(&'static str, &'static str)>| {
        let mut request = client.get(data(&gateway, "/v1/models"));
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    for _ in 0..3 {
        let response = send(Some((ROUTING_KEY, "metrics-key"))).await.unwrap();
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
    }
    for _ in 0..2 {
        send(None).await.unwrap().bytes().await.unwrap();
    }
    send(Some((TARGET, "b")))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let miss = send(Some((TARGET, "nobody"))).await.unwrap();
    assert_eq!(miss.status(), 503);
    send(Some(("authorization", "Bearer t")))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();

    // Histograms are observed when the body ends, a moment after the client has it all. Every
    // request counts, the refused target-worker miss too: 7 served + 1 refused.
    let mut after;
    eventually!("8 request durations observed", {
        after = scrape(&gateway).await;
        sample(&after, "bch_request_duration_seconds_count", "") == Some(8.0)
    });
    assert_eq!(branch(&after, "explicit_routing_key_hit"), 3.0);
    assert_eq!(branch(&after, "keyless"), 2.0);
    assert_eq!(branch(&after, "target_worker_hit"), 1.0);
    assert_eq!(branch(&after, "target_worker_miss"), 1.0);
    assert_eq!(branch(&after, "implicit_routing_key_hit"), 1.0);
    assert_eq!(branch(&after, "explicit_routing_key_spillover"), 0.0);
    assert_eq!(
        sample(&after, "bch_response_headers_seconds_count", ""),
        Some(7.0)
    );
    // By status class and worker: 7 answered 2xx by a worker, the miss refused without one.
    let class =
        |text: &str, labels: &str| sample(text, "bch_responses_total", labels).unwrap_or(0.0);
    let ok: f64 = ["a", "b"]
        .iter()
        .map(|w| class(&after, &format!("status_class=\"2xx\",worker=\"{w}\"")))
        .sum();
    assert_eq!(ok, 7.0);
    assert_eq!(class(&after, "status_class=\"5xx\",worker=\"\""), 1.0);
    let durations: f64 = ["a", "b"]
        .iter()
        .map(|w| {
            sample(
                &after,
                "bch_worker_request_duration_seconds_count",
                &format!("worker=\"{w}\""),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(
        durations, 7.0,
        "per-worker durations of the served requests"
    );
    assert_eq!(
        sample(&after, "bch_time_to_first_token_seconds_count", ""),
        Some(0.0),
        "no event stream yet"
    );
    assert_eq!(
        sample(&after, "bch_policy_kind", "kind=\"consistent_hashing\""),
        Some(1.0)
    );
    assert_eq!(sample(&after, "bch_policy_min_load_gap", ""), Some(2.0));
    assert_eq!(sample(&after, "bch_policy_max_load_skew", ""), Some(1.5));
    assert_eq!(
        sample(&after, "bch_policy_spill_order", "order=\"ring\""),
        Some(1.0)
    );
    assert_eq!(
        sample(&after, "bch_policy_spill_order", "order=\"hash_seeded\""),
        Some(0.0)
    );
    assert!(after.contains(&format!(
        "bch_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    )));
    // An event stream: the first data chunk is the first token, well before the stream's end.
    let whole_before = sample(&after, "bch_request_duration_seconds_sum", "").unwrap();
    let sse = client
        .get(data(&gateway, "/sse?n=3&gap_ms=30"))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    sse.bytes().await.unwrap();
    eventually!("one time to first token observed", {
        after = scrape(&gateway).await;
        sample(&after, "bch_time_to_first_token_seconds_count", "") == Some(1.0)
    });
    let ttft = sample(&after, "bch_time_to_first_token_seconds_sum", "").unwrap();
    eventually!("the stream's duration observed", {
        after = scrape(&gateway).await;
        sample(&after, "bch_request_duration_seconds_count", "") == Some(9.0)
    });
    let stream = sample(&after, "bch_request_duration_seconds_sum", "").unwrap() - whole_before;
    assert!(
        ttft > 0.0 && ttft < stream,
        "the first chunk came before the end: {ttft} vs {stream}"
    );
    let per_worker: f64 = ["a", "b"]
        .iter()
        .map(|w| {
            sample(
                &after,
                "bch_worker_requests_total",
                &format!("worker=\"{w}\""),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(per_worker, 8.0, "the 7 served, then the event stream");
    assert!(
        sample(&after, "bch_worker_requests_total", "worker=\"b\"").unwrap() >= 1.0,
        "the target request went to b"
    );
    for w in ["a", "b"] {
        assert_eq!(
            sample(&after, "bch_worker_active", &format!("worker=\"{w}\"")),
            Some(0.0)
        );
    }
    gateway.shutdown().await;
}
