//! Routing by model through a real gateway: each model's requests reach only its workers, the
//! body is forwarded unchanged (however it was split, wherever `model` is in it), what names no
//! model or an unknown one is refused as OpenAI clients expect, `GET /v1/models` is the union of
//! the pools, a body's `rid` places like the routing-key header, and a fleet with one model never
//! holds a body back.

use std::net::SocketAddr;
use std::time::Duration;

use bch_drill::sim::SimConfig;
use bch_drill::worker::spawn_worker;
use bytes::Bytes;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::common::{FakeWorker, client, fake_worker, start, test_config};

/// Fake workers named `names`, each declaring the models `models_of` gives for its name, and the
/// test configuration naming them.
async fn fleet(
    names: &[&str],
    models_of: impl Fn(&str) -> Vec<String>,
) -> (Vec<FakeWorker>, Config) {
    let mut workers = Vec::new();
    for name in names {
        workers.push(fake_worker(name).await);
    }
    let mut config = test_config(&workers.iter().collect::<Vec<_>>());
    for worker in &mut config.workers {
        worker.models = models_of(worker.name.as_deref().unwrap());
    }
    (workers, config)
}

/// Four fake workers: `a0`, `a1` serve `alpha`, `b0`, `b1` serve `beta`.
async fn two_model_fleet() -> (Vec<FakeWorker>, Config) {
    fleet(&["a0", "a1", "b0", "b1"], |name| {
        let model = if name.starts_with('a') {
            "alpha"
        } else {
            "beta"
        };
        vec![model.to_owned()]
    })
    .await
}

/// A gateway started in front of [`two_model_fleet`].
async fn two_model_gateway() -> (Vec<FakeWorker>, RunningGateway) {
    let (workers, config) = two_model_fleet().await;
    (workers, start(config).await)
}

/// POSTs `body` with `headers` to the gateway's `/echo`.
async fn post_with(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    let mut request = client().post(format!("http://{addr}/echo"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body).send().await.unwrap()
}

/// POSTs a JSON `body` to the gateway's `/echo` and answers the status and the JSON answer.
async fn post(addr: SocketAddr, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let response = post_with(addr, &[("content-type", "application/json")], body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// GETs `path` from `addr` and answers the JSON answer.
async fn get(addr: SocketAddr, path: &str) -> Value {
    let response = client().get(format!("http://{addr}{path}")).send().await;
    response.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn each_models_requests_reach_only_its_workers_with_the_body_unchanged() {
    let (_workers, gateway) = two_model_gateway().await;
    for i in 0..16 {
        for (model, prefix) in [("alpha", "a"), ("beta", "b")] {
            let body = json!({"messages": [{"role": "user", "content": format!("{{\"model\": \"x{i}\"}}")}], "model": model, "user": format!("u{i}")}).to_string();
            let (status, echoed) = post(gateway.data_addr, body.clone()).await;
            assert_eq!(status, 200, "{echoed}");
            let worker = echoed["worker"].as_str().unwrap();
            assert!(worker.starts_with(prefix), "{model} went to {worker}");
            assert_eq!(echoed["body"], body);
        }
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn each_models_decisions_are_counted_under_its_model() {
    let (_workers, config) = two_model_fleet().await;
    let gateway = start(config).await;
    for (model, times) in [("alpha", 3), ("beta", 5), ("gamma", 2)] {
        for _ in 0..times {
            let (status, _) = post(gateway.data_addr, json!({"model": model}).to_string()).await;
            assert_eq!(status, if model == "gamma" { 404 } else { 200 });
        }
    }
    for _ in 0..2 {
        let response = client()
            .post(format!("http://{}/echo", gateway.data_addr))
            .header("x-smg-routing-key", "conversation-1")
            .body(r#"{"model":"beta"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let metrics = gateway.metrics_text();
    let count = |branch: &str, model: &str| {
        let series = format!("bch_branch_total{{branch=\"{branch}\",model=\"{model}\"}} ");
        (metrics.lines())
            .find_map(|line| line.strip_prefix(series.as_str()))
            .unwrap_or_else(|| panic!("no {series}: {metrics}"))
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(count("keyless", "alpha"), 3);
    assert_eq!(count("keyless", "beta"), 5);
    assert_eq!(count("explicit_routing_key_hit", "beta"), 2);
    assert_eq!(count("explicit_routing_key_hit", "alpha"), 0);
    assert!(
        !metrics.contains("model=\"gamma\"")
            && !metrics.contains("bch_branch_total{branch=\"keyless\"} "),
        "an unknown model decides nothing; with models every series names one: {metrics}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_model_after_a_megabyte_in_many_small_writes_is_routed_and_forwarded_whole() {
    let (_workers, gateway) = two_model_gateway().await;
    let content = "{\"model\": \"alpha\"} ".repeat(60_000);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":{}}}],"model":"beta"}}"#,
        serde_json::to_string(&content).unwrap()
    );
    assert!(body.len() > 1 << 20);
    // A chunked body written 1,000 bytes at a time.
    let chunks: Vec<Result<Bytes, std::io::Error>> = body
        .as_bytes()
        .chunks(1_000)
        .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
        .collect();
    let stream = futures_util::stream::iter(chunks);
    let (status, echoed) = post(gateway.data_addr, reqwest::Body::wrap_stream(stream)).await;
    assert_eq!(status, 200);
    assert!(
        echoed["worker"].as_str().unwrap().starts_with('b'),
        "{}",
        echoed["worker"]
    );
    assert_eq!(echoed["body_len"], body.len());
    assert_eq!(echoed["body"], body);
    // A short body three bytes a time, the model split across writes.
    let short = r#"{"stream":false,"messages":[{"role":"user","content":"hi"}],"model":"alpha"}"#;
    let tiny: Vec<Result<Bytes, std::io::Error>> = short
        .as_bytes()
        .chunks(3)
        .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
        .collect();
    let stream = futures_util::stream::iter(tiny);
    let (status, echoed) = post(gateway.data_addr, reqwest::Body::wrap_stream(stream)).await;
    assert_eq!(status, 200);
    assert!(
        echoed["worker"].as_str().unwrap().starts_with('a'),
        "{}",
        echoed["worker"]
    );
    assert_eq!(echoed["body"], short);
    // The same body with its length declared: the worker gets the same length.
    let (status, echoed) = post(gateway.data_addr, body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(echoed["headers"]["content-length"], body.len().to_string());
    assert_eq!(echoed["body"], body);
    gateway.shutdown().await;
}

#[tokio::test]
async fn what_names_no_model_gets_400_or_the_default_model_and_an_unknown_one_404() {
    let (_workers, mut config) = two_model_fleet().await;
    let gateway = start(config.clone()).await;
    for body in [
        "prompt=hello",
        r#"{"text":"hi","sampling_params":{"model":"alpha"}}"#,
        "",
    ] {
        let (status, answer) = post(gateway.data_addr, body).await;
        assert_eq!(status, 400, "{body:?}: {answer}");
        assert_eq!(answer["error"]["code"], "model_required");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("\"model\""), "{message}");
    }
    let (status, answer) = post(gateway.data_addr, r#"{"model":"gamma"}"#).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"]["code"], "model_not_found");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gamma")
    );
    // The header wins over the body, as the Inference Extension's body-based routing sets it.
    let headers = [("x-gateway-model-name", "beta")];
    let response = post_with(gateway.data_addr, &headers, r#"{"model":"alpha"}"#).await;
    let echoed: Value = response.json().await.unwrap();
    assert!(
        echoed["worker"].as_str().unwrap().starts_with('b'),
        "{echoed}"
    );
    gateway.shutdown().await;

    config.routing.default_model = Some("beta".into());
    let gateway = start(config).await;
    for body in ["prompt=hello", r#"{"text":"hi"}"#] {
        let (status, echoed) = post(gateway.data_addr, body).await;
        assert_eq!(status, 200, "{echoed}");
        assert!(
            echoed["worker"].as_str().unwrap().starts_with('b'),
            "{echoed}"
        );
        assert_eq!(echoed["body"], body);
    }
    let got = get(gateway.data_addr, "/echo").await;
    assert!(got["worker"].as_str().unwrap().starts_with('b'), "{got}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_gateways_model_list_is_the_union_of_its_pools() {
    let (_workers, mut config) = two_model_fleet().await;
    config.workers[1].models.push("gamma".into());
    let gateway = start(config).await;
    let list = get(gateway.data_addr, "/v1/models").await;
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta", "gamma"]);
    assert!(
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["object"] == "model")
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_worker_without_models_is_refused_in_a_fleet_with_models() {
    let (_workers, gateway) = two_model_gateway().await;
    let extra = fake_worker("plain").await;
    let response = client()
        .post(format!("http://{}/admin/workers", gateway.control_addr))
        .json(&WorkerConfig::from_url(&extra.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let answer: Value = response.json().await.unwrap();
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("models") && message.contains("declares no model"),
        "{message}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn simulated_workers_answer_as_the_model_they_were_asked_for() {
    let mut config = test_config(&[]);
    let mut workers = Vec::new();
    for model in ["alpha", "beta"] {
        let sim = SimConfig {
            model: model.to_owned(),
            ..SimConfig::default().with_time_scale(0.01)
        };
        let worker = spawn_worker(([127, 0, 0, 1], 0).into(), model, sim)
            .await
            .unwrap();
        config.workers.push(WorkerConfig {
            name: Some(model.to_owned()),
            models: vec![model.to_owned()],
            ..WorkerConfig::from_url(&worker.url())
        });
        workers.push(worker);
    }
    let gateway = start(config).await;
    for model in ["beta", "alpha", "beta"] {
        let answer: Value = client()
            .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "model": model, "max_tokens": 2}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["model"], model, "{answer}");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_rid_places_its_lineage_like_the_routing_key_header_and_wins_over_it() {
    let (_workers, mut config) = fleet(&["w0", "w1", "w2", "w3"], |_| Vec::new()).await;
    config.routing.key_from_rid = true;
    let gateway = start(config).await;
    let mut seen = std::collections::HashSet::new();
    for i in 0..24 {
        let session = format!("conv{i}");
        let headers = [("x-smg-routing-key", session.as_str())];
        let response = post_with(gateway.data_addr, &headers, "{}").await;
        let by_header: Value = response.json().await.unwrap();
        let home = by_header["worker"].as_str().unwrap().to_owned();
        seen.insert(home.clone());
        for rid in [
            format!("conv{i}_t5_r1"),
            format!("conv{i}_t1"),
            format!("conv{i}"),
        ] {
            let headers = [("x-smg-routing-key", "another-session")];
            let body = json!({"text": "hi", "rid": rid}).to_string();
            let response = post_with(gateway.data_addr, &headers, body).await;
            assert_eq!(
                response.headers()["x-bch-branch"],
                "explicit_routing_key_hit"
            );
            let by_rid: Value = response.json().await.unwrap();
            assert_eq!(by_rid["worker"], home.as_str(), "{rid}");
        }
    }
    assert!(seen.len() > 1, "the keys spread over the workers: {seen:?}");
    gateway.shutdown().await;
}

/// A worker on raw TCP that tells the test how many body bytes it got before the body ended,
/// then answers 200; health probes get 200 at once.
async fn first_bytes_worker() -> (SocketAddr, mpsc::UnboundedReceiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (told, heard) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let told = told.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let head_end = loop {
                        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    buffer.drain(..head_end);
                    if length > 0 {
                        while buffer.is_empty() {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let _ = told.send(buffer.len());
                        while buffer.len() < length {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buffer.drain(..length);
                    }
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, heard)
}

/// Sends a request head and the first part of its body, waits until the worker says it got
/// body bytes, then sends the rest: the worker must hear of the first part first.
async fn worker_hears_the_start_before_the_end(models: &[&str]) {
    let (addr, mut heard) = first_bytes_worker().await;
    let mut config = test_config(&[]);
    config.workers.push(WorkerConfig {
        name: Some("raw".into()),
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..WorkerConfig::from_url(&format!("http://{addr}"))
    });
    let other = fake_worker("other").await;
    if models.len() > 1 {
        // A second model's worker: the body is read up to its model, and not further.
        config.workers.push(WorkerConfig {
            name: Some("other".into()),
            models: vec!["other".into()],
            ..WorkerConfig::from_url(&other.url())
        });
    }
    let gateway = start(config).await;
    let first = format!(
        r#"{{"model":"{}","messages":["#,
        models.first().unwrap_or(&"m")
    );
    let rest = r#""hello"]}"#;
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        first.len() + rest.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first.as_bytes()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("the worker gets the body's start before the client sent its end")
        .unwrap();
    assert!(got > 0 && got <= first.len(), "{got}");
    stream.write_all(rest.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.ends_with(b"ok") {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    gateway.shutdown().await;
    drop(other);
}

#[tokio::test]
async fn a_fleet_with_one_model_or_none_streams_the_body_unread() {
    worker_hears_the_start_before_the_end(&[]).await;
    worker_hears_the_start_before_the_end(&["alpha"]).await;
}

#[tokio::test]
async fn with_two_models_the_body_streams_once_its_model_was_read() {
    worker_hears_the_start_before_the_end(&["alpha", "beta"]).await;
}
