//! Secrets drill (docs/reliability.md): an `Authorization` or `Cookie` value sent by a client, the
//! admin token, a wrong token presented to the control plane and the password in a refused worker
//! URL never appear in the logs (every level, text and JSON), the metrics, the telemetry frames or
//! the gateway's error bodies — on success and on every error path (502, 503, 504, 413, 401, 400,
//! a broken stream).
//!
//! This binary owns the global tracing subscriber: everything logged at TRACE goes into a buffer.

mod common;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use gatewayd::config::WorkerConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tracing_subscriber::prelude::*;

const AUTH_SECRET: &str = "AUTHSECRET-4f9a0c";
const COOKIE_SECRET: &str = "COOKIESECRET-77e1b2";
const ADMIN_SECRET: &str = "ADMINTOKEN-SECRET-d00d";
const WRONG_SECRET: &str = "WRONGTOKEN-SECRET-beef";
const WORKER_SECRET: &str = "WORKERPASS-SECRET-f00d";
const SECRETS: [&str; 5] = [
    AUTH_SECRET,
    COOKIE_SECRET,
    ADMIN_SECRET,
    WRONG_SECRET,
    WORKER_SECRET,
];

/// A data-plane request: method, path, one extra header, body.
type Case = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
    Vec<u8>,
);

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{secret} leaked into {what}:\n{}",
            excerpt(text, secret)
        );
    }
}

fn excerpt(text: &str, secret: &str) -> String {
    let at = text.find(secret).unwrap_or(0);
    let start = text[..at]
        .char_indices()
        .rev()
        .nth(300)
        .map_or(0, |(i, _)| i);
    text[start..(at + secret.len() + 100).min(text.len())].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_leak() {
    let logs = Buffer::default();
    let (text_writer, json_writer) = (logs.clone(), logs.clone());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || text_writer.clone()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(move || json_writer.clone()),
        )
        .with(tracing_subscriber::filter::LevelFilter::TRACE)
        // The test's own websocket client logs its handshake request (with the token it sends) at
        // TRACE; that is this test's client, not the gateway.
        .with(tracing_subscriber::filter::filter_fn(|meta| {
            !meta.target().starts_with("tungstenite::handshake::client")
        }))
        .init();

    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let token_file = std::env::temp_dir().join(format!("bch-secrets-{}", std::process::id()));
    std::fs::write(&token_file, format!("{ADMIN_SECRET}\n")).unwrap();
    let mut config = test_config(&[&a, &b]);
    config.server.control_access.admin_token_file = Some(token_file.clone());
    config.server.timeouts.first_byte = Duration::from_millis(300);
    config.server.limits.max_body_bytes = 1024;
    // Only passive marking may take the dead worker down, so the first request to it is a 502.
    config.health.interval = Duration::from_millis(3_600_000);
    // A worker nobody listens on: 502, then (marked down) 503.
    // The port stays bound but never listens, so connects are refused and no other listener (such
    // as this gateway's own) can take it.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead_url = format!("http://{}", reserved.local_addr().unwrap());
    config.workers.push(WorkerConfig {
        name: Some("dead".into()),
        url: dead_url,
        ring_id: None,
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    });
    let gateway = start(config).await;
    let data = format!("http://{}", gateway.data_addr);
    let control = format!("http://{}", gateway.control_addr);
    let admin = format!("Bearer {ADMIN_SECRET}");

    // Telemetry: a client with the right token records every frame.
    let mut request = format!("ws://{}/ws", gateway.control_addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", admin.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let frames = Arc::new(Mutex::new(String::new()));
    let recorder = {
        let frames = Arc::clone(&frames);
        tokio::spawn(async move {
            while let Some(Ok(message)) = ws.next().await {
                if let Message::Text(text) = message {
                    let mut f = frames.lock().unwrap_or_else(PoisonError::into_inner);
                    f.push_str(&text);
                    f.push('\n');
                }
            }
        })
    };

    let http = client();
    let auth = format!("Bearer sk-live-{AUTH_SECRET}");
    let cookie = format!("session={COOKIE_SECRET}; theme=dark");
    let mut error_bodies = Vec::new();
    let mut statuses = Vec::new();
    // (method, path, extra header, body): every data-plane path, each with both credentials.
    let cases: Vec<Case> = vec![
        // First, while "dead" is still marked healthy: 502 (later keyed requests may hash to it,
        // fail to connect and mark it down).
        (
            "POST",
            "/v1/chat/completions",
            Some(("x-smg-target-worker", "dead")),
            b"{}".to_vec(),
        ),
        ("POST", "/v1/chat/completions", None, b"{}".to_vec()),
        (
            "POST",
            "/v1/chat/completions",
            Some(("x-smg-routing-key", "session-1")),
            b"{}".to_vec(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(("x-smg-target-worker", "dead")),
            b"{}".to_vec(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(("x-smg-target-worker", "nope")),
            b"{}".to_vec(),
        ),
        ("POST", "/stall", None, b"{}".to_vec()),
        ("GET", "/crash", None, Vec::new()),
        ("POST", "/v1/chat/completions", None, vec![b'x'; 4096]),
        ("GET", "/status/500", None, Vec::new()),
        (
            "GET",
            "/sse?n=3&gap_ms=1",
            Some(("x-smg-routing-key", "k")),
            Vec::new(),
        ),
    ];
    for (method, path, extra, body) in cases {
        let mut request = http
            .request(method.parse().unwrap(), format!("{data}{path}"))
            .header("authorization", &auth)
            .header("cookie", &cookie)
            .body(body);
        if let Some((name, value)) = extra {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        // A response the gateway made (no worker name on it) is the gateway's error body; for the
        // broken stream, the gateway's part is the final error event.
        let from_worker = response.headers().contains_key("x-worker-name");
        let text = response.text().await.unwrap_or_default();
        statuses.push(format!("{path}:{status}"));
        if !from_worker {
            error_bodies.push(text);
        } else if let Some(at) = text.find("event: error") {
            error_bodies.push(text[at..].to_owned());
        }
    }
    // The control plane: no token, a wrong token, and explain of an implicit key.
    for presented in [None, Some(format!("Bearer {WRONG_SECRET}"))] {
        for path in ["/admin/policy", "/metrics", "/ws"] {
            let mut request = http.get(format!("{control}{path}"));
            if let Some(p) = &presented {
                request = request.header("authorization", p);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401);
            error_bodies.push(response.text().await.unwrap());
        }
    }
    let explained = http
        .get(format!(
            "{control}/admin/explain?routing_key=sk-live-{AUTH_SECRET}&explicit=false"
        ))
        .header("authorization", &admin)
        .send()
        .await
        .unwrap();
    assert_eq!(explained.status(), 200);
    error_bodies.push(explained.text().await.unwrap());
    // A worker URL with credentials is refused; the password shows up nowhere.
    let with_credentials = http
        .post(format!("{control}/admin/workers"))
        .header("authorization", &admin)
        .json(&serde_json::json!({"url": format!("http://llm:{WORKER_SECRET}@{}", a.addr)}))
        .send()
        .await
        .unwrap();
    assert_eq!(with_credentials.status(), 400);
    error_bodies.push(with_credentials.text().await.unwrap());
    let bad_policy = http
        .put(format!("{control}/admin/policy"))
        .header("authorization", &admin)
        .header("content-type", "application/json")
        .header("cookie", &cookie)
        .body(format!(r#"{{"max_load_skew":"{COOKIE_SECRET}"}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_policy.status(), 400);
    let bad_policy_body = bad_policy.text().await.unwrap();

    // Telemetry has seen the implicit key (as a hash) and the load is back to 0.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = frames
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let idle = gateway
            .routing_table()
            .workers()
            .iter()
            .all(|w| w.stats.active() == 0);
        if seen.contains("\"implicit:") && idle {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "telemetry and load");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let metrics = http
        .get(format!("{control}/metrics"))
        .header("authorization", &admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    gateway.shutdown().await;
    recorder.abort();
    let frames = frames
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let log = logs.text();

    // The checks are not vacuous: each source saw the traffic.
    assert!(
        log.contains("status=502") && log.contains("\"status\":504"),
        "{log}"
    );
    assert!(metrics.contains("bch_worker_requests_total"));
    assert!(frames.contains("\"type\":\"tick\""));
    assert!(
        statuses.iter().any(|s| s.ends_with(":502"))
            && statuses.iter().any(|s| s.ends_with(":503"))
            && statuses.iter().any(|s| s.ends_with(":504"))
            && statuses.iter().any(|s| s.ends_with(":413")),
        "{statuses:?}"
    );
    assert_clean("the logs", &log);
    assert_clean("the metrics", &metrics);
    assert_clean("the telemetry frames", &frames);
    for body in &error_bodies {
        assert_clean("an error body", body);
    }
    eprintln!(
        "DRILL secrets: requests={} statuses={statuses:?} error_bodies={} log_bytes={} metrics_bytes={} frame_bytes={} \
         secrets_found=0 (a PUT whose bad value is itself a secret echoes it back to its own sender: {})",
        statuses.len() + 9,
        error_bodies.len(),
        log.len(),
        metrics.len(),
        frames.len(),
        bad_policy_body.contains(COOKIE_SECRET)
    );
    drop(reserved);
    let _ = std::fs::remove_file(token_file);
}
