//! Abuse: slow-loris, connection floods, huge and non-UTF-8 headers, malformed websocket frames,
//! bad tokens and path tricks.

use std::time::{Duration, Instant};

use crate::common::*;
use bch_core::telemetry::ServerMessage;
use futures_util::{SinkExt, StreamExt};
use gatewayd::RunningGateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use super::*;

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn metric(gateway: &RunningGateway, name: &str) -> f64 {
    let text = gateway.metrics_text();
    // Sum over every label set of the family.
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_slow_loris() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    config.server.timeouts.header_read = Duration::from_millis(300);
    let gateway = start(config).await;
    let addr = gateway.data_addr;
    let slow = scaled(16, 200);
    let mut tasks = Vec::new();
    for i in 0..slow {
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let start = Instant::now();
            // Half say nothing at all; half drip a request head one byte at a time.
            let drip: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-smg-routing-key: loris\r\nx-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
            let mut sent = 0;
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            let deadline = Duration::from_secs(5);
            loop {
                assert!(
                    start.elapsed() < deadline,
                    "slow client {i} still connected after {deadline:?}"
                );
                tokio::select! {
                    read = stream.read(&mut buf) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    },
                    () = tokio::time::sleep(Duration::from_millis(20)), if i % 2 == 1 => {
                        if sent < drip.len() {
                            if stream.write_all(&drip[sent..=sent]).await.is_err() {
                                break;
                            }
                            sent += 1;
                        }
                    }
                }
            }
            (start.elapsed(), String::from_utf8_lossy(&got).into_owned())
        }));
    }
    // Meanwhile, normal clients are served.
    let mut served = 0;
    for _ in 0..20 {
        let response = client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .header(ROUTING_KEY, "normal")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        served += 1;
    }
    let mut closed_after = Vec::new();
    for task in tasks {
        let (elapsed, got) = task.await.unwrap();
        assert!(
            got.is_empty() || got.starts_with("HTTP/1.1 408"),
            "slow client got {got:?}"
        );
        closed_after.push(elapsed.as_millis());
    }
    closed_after.sort_unstable();
    assert_all_idle(&gateway).await;
    gateway_is_healthy(&gateway).await;
    eprintln!(
        "DRILL abuse_slow_loris: slow_clients={slow} header_read_timeout_ms=300 closed_after_ms min={} max={} normal_requests_served={served}",
        closed_after[0],
        closed_after[closed_after.len() - 1]
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_connection_flood() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    config.server.limits.max_connections = 16;
    config.server.timeouts.header_read = Duration::from_millis(60_000);
    let gateway = start(config).await;
    let addr = gateway.data_addr;
    // Fill every slot with an idle connection.
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let flood = scaled(2_000, 20_000);
    let batch = 100;
    // Warm-up batch (allocator arenas, task slabs), then measure.
    let rss_before = rss_kib();
    let mut answered = 0usize;
    let mut bodies_ok = 0usize;
    let mut i = 0;
    while i < flood {
        let n = batch.min(flood - i);
        let replies = futures_util::future::join_all((0..n).map(|_| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            raw::read_reply(&mut stream, Duration::from_secs(5)).await
        }))
        .await;
        for reply in replies {
            assert!(reply.closed, "over-capacity connection left open");
            assert_eq!(reply.status, Some(503), "{reply:?}");
            answered += 1;
            let body: serde_json::Value = serde_json::from_str(reply.body()).expect("JSON body");
            assert_eq!(body["error"]["code"], "too_many_connections");
            bodies_ok += 1;
        }
        i += n;
    }
    let rss_after = rss_kib();
    // A real client that sends its request at once also gets the 503 (or, at worst, a reset: never
    // a hang).
    let with_request = raw::exchange(
        addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-smg-routing-key: k\r\n\r\n",
    )
    .await;
    assert!(with_request.closed);
    let rejected = metric(&gateway, "bch_rejected_connections_total");
    // Free the slots: the gateway serves again.
    drop(held);
    let start = Instant::now();
    loop {
        let reply = raw::exchange(
            addr,
            b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        if reply.status == Some(200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "slots never freed: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gateway_is_healthy(&gateway).await;
    assert_all_idle(&gateway).await;
    let growth_kib = match (rss_before, rss_after) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => 0,
    };
    eprintln!(
        "DRILL abuse_connection_flood: max_connections=16 held=16 flood={flood} answered_503={answered} json_bodies={bodies_ok} \
         rejected_metric={rejected} request_first_client={:?} rss_growth_kib={growth_kib}",
        with_request.status
    );
    assert!(rejected >= flood as f64);
    assert!(
        growth_kib < 32 * 1024,
        "memory grew by {growth_kib} KiB over {flood} rejected connections"
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_huge_and_invalid_headers() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let worker = fake_worker("w").await;
    let token_file = std::env::temp_dir().join(format!("bch-drill-token-{}", std::process::id()));
    std::fs::write(&token_file, "drill-token\n").unwrap();
    let mut config = test_config(&[&worker]);
    config.server.control_access.admin_token_file = Some(token_file.clone());
    let gateway = start(config).await;
    let (data, control) = (gateway.data_addr, gateway.control_addr);
    let mut figures = Vec::new();

    // 1 MiB header values, on both planes and in every header the gateway reads.
    let huge = "a".repeat(1 << 20);
    for (plane, addr) in [("data", data), ("control", control)] {
        for name in [
            "x-smg-routing-key",
            "x-smg-target-worker",
            "authorization",
            "cookie",
            "x-padding",
        ] {
            let request = format!(
                "GET /admin/policy HTTP/1.1\r\nhost: x\r\n{name}: {huge}\r\nconnection: close\r\n\r\n"
            );
            let reply = raw::exchange(addr, request.as_bytes()).await;
            assert!(reply.closed, "{plane} {name}: connection left open");
            assert!(
                matches!(reply.status, Some(400 | 431)) || reply.text.is_empty(),
                "{plane} {name}: {:?}",
                &reply.text[..reply.text.len().min(200)]
            );
            figures.push(format!("{plane}/{name}:{:?}", reply.status));
        }
    }

    // Invalid UTF-8 wherever a header is read. Each gets an answer with a status; gateway answers
    // are OpenAI-shaped JSON.
    let bad = b"\xff\xfe\xc3\x28 \x80";
    let data_cases: [(&str, &[u16]); 9] = [
        ("x-smg-routing-key", &[200]),
        ("x-smg-target-worker", &[503]),
        ("authorization", &[200]),
        ("x-forwarded-for", &[200]),
        ("cookie", &[200]),
        ("connection", &[200]),
        ("content-type", &[200]),
        ("host", &[200, 400]),
        ("content-length", &[400]),
    ];
    let ignored_before = metric(&gateway, "bch_ignored_routing_keys_total");
    for (name, expected) in data_cases {
        let mut request = b"POST /v1/chat/completions HTTP/1.1\r\nconnection: close\r\n".to_vec();
        if name != "host" {
            request.extend_from_slice(b"host: x\r\n");
        }
        if name != "content-length" {
            request.extend_from_slice(b"content-length: 2\r\n");
        }
        request.extend_from_slice(format!("{name}: ").as_bytes());
        request.extend_from_slice(bad);
        request.extend_from_slice(b"\r\n\r\n{}");
        let reply = raw::exchange(data, &request).await;
        let status = reply.status.unwrap_or_else(|| panic!("{name}: no answer"));
        assert!(
            expected.contains(&status),
            "{name}: {status} {}",
            reply.text
        );
        if status == 503 {
            assert!(is_openai_error(reply.body().as_bytes()), "{}", reply.text);
        }
        figures.push(format!("utf8/{name}:{status}"));
    }
    let control_cases: [(&[u8], u16); 5] = [
        (b"GET /admin/policy HTTP/1.1\r\nhost: x\r\nauthorization: Bearer \xff\xfe\r\nconnection: close\r\n\r\n", 401),
        (b"GET /admin/policy HTTP/1.1\r\nhost: x\r\nauthorization: \xff\xfe drill-token\r\nconnection: close\r\n\r\n", 401),
        // Decoded to bytes that are not UTF-8: refused, as the data plane ignores such a key header.
        (b"GET /admin/explain?routing_key=%FF%FE HTTP/1.1\r\nhost: x\r\nauthorization: Bearer drill-token\r\nconnection: close\r\n\r\n", 400),
        (b"DELETE /admin/workers/%FF%FE HTTP/1.1\r\nhost: x\r\nauthorization: Bearer drill-token\r\nconnection: close\r\n\r\n", 400),
        // The key is only hashed into Sec-WebSocket-Accept, so any bytes upgrade (the client then
        // fails the handshake check); what matters is a well-formed answer.
        (b"GET /ws HTTP/1.1\r\nhost: x\r\nauthorization: Bearer drill-token\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: \xff\xfe\xfd\r\n\r\n", 101),
    ];
    for (request, expected) in control_cases {
        let reply = raw::exchange(control, request).await;
        let first_line = reply.text.lines().next().unwrap_or_default().to_owned();
        assert!(
            reply
                .status
                .is_some_and(|s| s == expected || (400..500).contains(&s)),
            "{:?}: {first_line}",
            String::from_utf8_lossy(request)
        );
        figures.push(format!("control:{}", first_line));
    }
    let ignored_after = metric(&gateway, "bch_ignored_routing_keys_total");
    assert_all_idle(&gateway).await;
    gateway_is_healthy(&gateway).await;
    // The gateway still routes keyed requests.
    let response = client()
        .post(format!("http://{data}/v1/chat/completions"))
        .header(ROUTING_KEY, "after-abuse")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    eprintln!(
        "DRILL abuse_headers: {} ignored_keys_metric {ignored_before}->{ignored_after}",
        figures.join(" ")
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
    let _ = std::fs::remove_file(token_file);
}

/// Writes raw bytes on an upgraded websocket and reports whether the server closed it in time.
async fn ws_raw_abuse(gateway: &RunningGateway, bytes: &[u8]) -> bool {
    let mut ws = ws_connect(gateway).await;
    let tokio_tungstenite::MaybeTlsStream::Plain(stream) = ws.get_mut() else {
        panic!("plain TCP expected");
    };
    let _ = stream.write_all(bytes).await;
    raw::read_reply(stream, Duration::from_secs(5)).await.closed
}

/// A masked client frame header (mask key zero, so the payload is sent as is).
fn frame(first: u8, payload_len: usize) -> Vec<u8> {
    let mut f = vec![first];
    match payload_len {
        0..=125 => f.push(0x80 | payload_len as u8),
        126..=0xFFFF => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(payload_len as u16).to_be_bytes());
        }
        _ => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(payload_len as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&[0, 0, 0, 0]);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_malformed_websocket() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let with_payload = |mut head: Vec<u8>, payload: &[u8]| {
        head.extend_from_slice(payload);
        head
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xFF; 64]),
        ("unmasked_text", b"\x81\x05hello".to_vec()),
        ("reserved_opcode", frame(0x83, 0)),
        ("rsv_bits", with_payload(frame(0xC1, 2), b"{}")),
        ("fragmented_ping", frame(0x09, 0)),
        ("long_ping", with_payload(frame(0x89, 200), &[b'p'; 200])),
        ("length_2_63", frame(0x81, 1 << 63)),
        (
            "frame_over_16k",
            with_payload(frame(0x81, 20_000), &[b'x'; 20_000]),
        ),
        (
            "invalid_utf8_text",
            with_payload(frame(0x81, 4), b"\xff\xfe\xfd\xfc"),
        ),
        (
            "continuation_without_start",
            with_payload(frame(0x80, 2), b"{}"),
        ),
        (
            "bad_close_code",
            with_payload(frame(0x88, 2), &[0x00, 0x01]),
        ),
    ];
    let mut closed = Vec::new();
    for (name, bytes) in &cases {
        assert!(
            ws_raw_abuse(&gateway, bytes).await,
            "{name}: connection not closed"
        );
        closed.push(*name);
    }
    // An oversized message made of small fragments (each frame under the limit, the message over).
    let mut fragments = with_payload(frame(0x01, 8_000), &[b'x'; 8_000]);
    for _ in 0..2 {
        fragments.extend(with_payload(frame(0x00, 8_000), &[b'x'; 8_000]));
    }
    fragments.extend(with_payload(frame(0x80, 10), &[b'x'; 10]));
    assert!(
        ws_raw_abuse(&gateway, &fragments).await,
        "fragmented oversize"
    );
    closed.push("fragmented_24k_message");
    // An oversized message from a well-behaved client library.
    let mut ws = ws_connect(&gateway).await;
    let _ = ws.send(Message::Text("x".repeat(64 * 1024).into())).await;
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "64 KiB message: connection not closed");
    closed.push("client_64k_message");

    // Unaffected: a fresh client gets its snapshot and commands still work.
    let mut ws = ws_connect(&gateway).await;
    assert!(matches!(
        next_message(&mut ws).await,
        Some(ServerMessage::Snapshot(_))
    ));
    ws.send(Message::Text(
        r#"{"type":"set_policy","id":1,"min_load_gap":3}"#.into(),
    ))
    .await
    .unwrap();
    loop {
        match next_message(&mut ws).await.unwrap() {
            ServerMessage::Ack(ack) => {
                assert_eq!(ack.policy.min_load_gap, 3);
                break;
            }
            ServerMessage::Error(e) => panic!("{}", e.message),
            _ => {}
        }
    }
    gateway_is_healthy(&gateway).await;
    eprintln!(
        "DRILL abuse_websocket: closed={} cases={closed:?}; fresh client served",
        closed.len()
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_tokens_and_path_traversal() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let token = "s3cret-drill-token";
    let token_file = std::env::temp_dir().join(format!("bch-drill-token2-{}", std::process::id()));
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let mut config = test_config(&[&a, &b]);
    config.server.control_access.admin_token_file = Some(token_file.clone());
    let gateway = start(config).await;
    let control = gateway.control_addr;
    let policy_before = gateway.routing_table().policy().to_owned();

    let endpoints = [
        ("GET", "/metrics"),
        ("GET", "/admin/workers"),
        ("POST", "/admin/workers"),
        ("DELETE", "/admin/workers/a"),
        ("GET", "/admin/policy"),
        ("PUT", "/admin/policy"),
        ("GET", "/admin/explain?routing_key=k"),
        ("POST", "/admin/reload"),
        ("GET", "/ws"),
        ("GET", "/nope"),
    ];
    let bad_auth: [Option<String>; 9] = [
        None,
        Some(String::new()),
        Some("Bearer".into()),
        Some("Bearer ".into()),
        Some("Bearer wrong".into()),
        Some(format!("Bearer {token}x")),
        Some(format!("Bearer {}", &token[..token.len() - 1])),
        Some(format!("Basic {token}")),
        Some(format!("Bearer  {token}")),
    ];
    let mut refused = 0;
    for (method, path) in endpoints {
        for auth in &bad_auth {
            let mut request =
                format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
            if let Some(auth) = auth {
                request.push_str(&format!("authorization: {auth}\r\n"));
            }
            let body = r#"{"name":"evil","url":"http://127.0.0.1:1","min_load_gap":9}"#;
            request.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ));
            let reply = raw::exchange(control, request.as_bytes()).await;
            assert_eq!(
                reply.status,
                Some(401),
                "{method} {path} {auth:?}: {}",
                reply.text
            );
            assert!(
                reply
                    .text
                    .to_ascii_lowercase()
                    .contains("www-authenticate: bearer")
            );
            assert!(is_openai_error(reply.body().as_bytes()), "{}", reply.text);
            refused += 1;
        }
    }
    // Path tricks, with the right token: a clear 4xx and nothing changes.
    let tricks = [
        "GET /../../etc/passwd",
        "GET /admin/../../etc/passwd",
        "GET /%2e%2e/%2e%2e/etc/passwd",
        "GET /admin/%2e%2e/%2e%2e/etc/passwd",
        "GET //admin/policy/..",
        "PUT /admin/./policy",
        "PUT /admin/policy/",
        "PUT /admin/policy/..",
        "PUT /admin/policy%2F..",
        "DELETE /admin/workers/..%2F..%2Fetc%2Fpasswd",
        "DELETE /admin/workers/%2e%2e%2fa",
        "DELETE /admin/workers/a%00",
        "DELETE /admin/workers/a/..",
        "DELETE /admin/workers/.%2e/policy",
        "POST /admin/workers/..",
        "GET /ws/../admin/policy",
        "GET /admin/workers%5c..%5cpolicy",
        "DELETE /admin\\workers\\a",
    ];
    let mut tricks_refused = 0;
    for trick in tricks {
        let (method, path) = trick.split_once(' ').unwrap();
        let body = r#"{"min_load_gap":9,"kind":"round_robin"}"#;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let reply = raw::exchange(control, request.as_bytes()).await;
        let status = reply.status.unwrap_or_else(|| panic!("{trick}: no answer"));
        assert!((400..500).contains(&status), "{trick}: {}", reply.text);
        assert!(!reply.text.contains("root:"), "{trick}");
        tricks_refused += 1;
    }
    // The data plane has no admin paths: such requests go to a worker, never to the control plane.
    let via_data = client()
        .put(format!("http://{}/admin/policy", gateway.data_addr))
        .header("authorization", format!("Bearer {token}"))
        .body(r#"{"min_load_gap":9}"#)
        .send()
        .await
        .unwrap();
    assert!(via_data.headers().contains_key("x-worker-name"));
    let table = gateway.routing_table();
    assert_eq!(*table.policy(), policy_before);
    let names: Vec<&str> = table
        .workers()
        .iter()
        .map(|w| w.spec.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    // The right token still works.
    let ok = client()
        .get(format!("http://{control}/admin/policy"))
        .header("authorization", format!("bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    gateway_is_healthy(&gateway).await;
    eprintln!(
        "DRILL abuse_control: unauthorised_refused={refused} ({} endpoints x {} bad credentials) path_tricks_refused={tricks_refused}; state unchanged",
        endpoints.len(),
        bad_auth.len()
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
    let _ = std::fs::remove_file(token_file);
}
