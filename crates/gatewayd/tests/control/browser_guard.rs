//! The control plane against a browser (docs/api.md, "Browsers"): what a web page can send — a
//! cross-site simple request, a script's request or websocket carrying its `Origin`, a DNS-rebound
//! request carrying a foreign `Host` — is refused and changes nothing, while curl, bch-tui and
//! bch-drill (no `Origin`, the listener's own `Host`) work as before. Also the OpenAI shape of the
//! control plane's 405 and 413. "Foreign" hosts are names that resolve nowhere or other 127.0.0.x
//! addresses: nothing leaves loopback.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use gatewayd::RunningGateway;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const EVIL: &str = "http://evil.example";
const WS_UPGRADE: &str = "upgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// A raw request's answer: status, headers (lower-cased names) and body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn code(&self) -> String {
        let json: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body));
        let error = &json["error"];
        assert!(
            error["message"].is_string() && error["type"] == "control_error",
            "{json}"
        );
        error["code"].as_str().unwrap().to_owned()
    }
}

/// Sends `head` (request line and headers, each ending in CRLF; `connection: close` is added) and
/// `body` verbatim. A `101` answer is returned as soon as its head is in.
async fn send(addr: SocketAddr, head: &str, body: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{head}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let request = if head.contains("upgrade: websocket") {
        // An upgrade has no body and must not say `connection: close`.
        format!("{head}\r\n")
    } else {
        request
    };
    // A refusal may come (and the connection close) before a large body is all written.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            response.extend_from_slice(&chunk[..n]);
            if n == 0 || complete(&response) {
                return;
            }
        }
    })
    .await
    .expect("an answer in time");
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status: head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not HTTP: {text:?}")),
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

/// Whether `response` holds a whole answer: a `101` head, or a head and its `Content-Length`
/// of body (a refused upgrade keeps its connection open).
fn complete(response: &[u8]) -> bool {
    let text = String::from_utf8_lossy(response);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    if head.starts_with("HTTP/1.1 101") {
        return true;
    }
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .and_then(|n| n.trim().parse::<usize>().ok())
        .is_some_and(|n| body.len() >= n)
}

async fn worker_count(gateway: &RunningGateway) -> usize {
    gateway.routing_table().workers().len()
}

async fn min_load_gap(gateway: &RunningGateway) -> u64 {
    gateway.routing_table().policy().min_load_gap
}

/// The exact cross-site requests a web page can make without a preflight, and the websocket a
/// page's script can open, are refused by a tokenless control plane; membership and policy stay.
#[tokio::test]
async fn a_web_page_cannot_change_membership_or_policy() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let addr = gateway.control_addr;
    let host = format!("host: {addr}\r\n");
    let worker = format!(
        r#"{{"name":"evil","url":"http://127.0.0.1:{}"}}"#,
        a.addr.port() + 1
    );
    let cases = [
        // A form or no-cors fetch: text/plain is a "simple" content type, sent with an Origin.
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}origin: {EVIL}\r\ncontent-type: text/plain;charset=UTF-8\r\n"
            ),
            403,
            "origin_not_allowed",
        ),
        // The same body with a browser that sends no Origin still cannot say JSON.
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}content-type: text/plain;charset=UTF-8\r\n"
            ),
            415,
            "unsupported_media_type",
        ),
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}content-type: application/x-www-form-urlencoded\r\n"
            ),
            415,
            "unsupported_media_type",
        ),
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}content-type: multipart/form-data; boundary=x\r\n"
            ),
            415,
            "unsupported_media_type",
        ),
        (
            format!("POST /admin/workers HTTP/1.1\r\n{host}"),
            415,
            "unsupported_media_type",
        ),
        // JSON from a page's script (after a preflight the gateway never approves, or from a
        // page the browser considers same-site): the Origin gives it away.
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}origin: {EVIL}\r\ncontent-type: application/json\r\n"
            ),
            403,
            "origin_not_allowed",
        ),
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}origin: null\r\ncontent-type: application/json\r\n"
            ),
            403,
            "origin_not_allowed",
        ),
        (
            format!(
                "POST /admin/workers HTTP/1.1\r\n{host}origin: http://127.0.0.1:3000\r\ncontent-type: application/json\r\n"
            ),
            403,
            "origin_not_allowed",
        ),
    ];
    for (head, status, code) in &cases {
        let answer = send(addr, head, &worker).await;
        assert_eq!(answer.status, *status, "{head}");
        assert_eq!(answer.code(), *code, "{head}");
    }
    for content_type in [
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
    ] {
        let head = format!("PUT /admin/policy HTTP/1.1\r\n{host}content-type: {content_type}\r\n");
        let answer = send(addr, &head, r#"{"min_load_gap":7}"#).await;
        assert_eq!(answer.status, 415, "{content_type}");
    }
    let head = format!(
        "PUT /admin/policy HTTP/1.1\r\n{host}origin: {EVIL}\r\ncontent-type: application/json\r\n"
    );
    assert_eq!(send(addr, &head, r#"{"min_load_gap":7}"#).await.status, 403);
    let reload = format!("POST /admin/reload HTTP/1.1\r\n{host}origin: {EVIL}\r\n");
    assert_eq!(send(addr, &reload, "").await.status, 403);
    let delete = format!("DELETE /admin/workers/a HTTP/1.1\r\n{host}origin: {EVIL}\r\n");
    assert_eq!(send(addr, &delete, "").await.status, 403);
    // The websocket: a page's script can open one to any address; its Origin is refused before
    // the upgrade, so no `set_policy` can follow.
    for origin in [EVIL, "http://localhost:8000", "null"] {
        let head = format!("GET /ws HTTP/1.1\r\n{host}origin: {origin}\r\n{WS_UPGRADE}");
        let answer = send(addr, &head, "").await;
        assert_eq!(answer.status, 403, "{origin}");
        assert_eq!(answer.code(), "origin_not_allowed");
    }
    assert_eq!(worker_count(&gateway).await, 1);
    assert_eq!(min_load_gap(&gateway).await, gateway_default_gap());

    // What programs send still works: JSON without Origin, bodyless writes, the websocket.
    let head = format!(
        "PUT /admin/policy HTTP/1.1\r\n{host}content-type: application/json; charset=utf-8\r\n"
    );
    assert_eq!(send(addr, &head, r#"{"min_load_gap":7}"#).await.status, 200);
    assert_eq!(min_load_gap(&gateway).await, 7);
    let head = format!("POST /admin/workers HTTP/1.1\r\n{host}content-type: Application/JSON\r\n");
    assert_eq!(send(addr, &head, &worker).await.status, 201);
    let delete = format!("DELETE /admin/workers/evil HTTP/1.1\r\n{host}");
    assert_eq!(send(addr, &delete, "").await.status, 200);
    let reload = format!("POST /admin/reload HTTP/1.1\r\n{host}");
    let answer = send(addr, &reload, "").await;
    assert_eq!(
        (answer.status, answer.code()),
        (409, "no_config_file".into())
    );
    for origin in [None, Some(format!("http://{addr}"))] {
        let origin = origin.map_or(String::new(), |o| format!("origin: {o}\r\n"));
        let head = format!("GET /ws HTTP/1.1\r\n{host}{origin}{WS_UPGRADE}");
        assert_eq!(send(addr, &head, "").await.status, 101, "{origin}");
    }
    gateway.shutdown().await;
}

fn gateway_default_gap() -> u64 {
    gatewayd::config::Config::default().policy.min_load_gap
}

/// DNS rebinding: a page whose name resolves to 127.0.0.1 is "same-origin" with the control
/// plane, but its requests name the page's host. A tokenless control plane answers only to its
/// own address, `localhost` and configured names, on reads too (telemetry carries routing keys).
#[tokio::test]
async fn a_rebound_name_reads_and_writes_nothing() {
    let a = fake_worker("a").await;
    let mut config = test_config(&[&a]);
    config.server.control_access.allowed_hosts = vec!["Console.BCH.invalid".into()];
    config.server.control_access.allowed_origins = vec!["http://console.bch.invalid:3000/".into()];
    let gateway = start(config).await;
    let addr = gateway.control_addr;
    let port = addr.port();
    for host in [
        format!("attacker.example:{port}"),
        "attacker.example".to_owned(),
        format!("127.0.0.2:{port}"),
        format!("[::1]:{port}"),
        format!("localhost.attacker.example:{port}"),
        String::new(),
    ] {
        for path in ["/admin/workers", "/metrics", "/admin/explain?routing_key=k"] {
            let answer = send(
                addr,
                &format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n"),
                "",
            )
            .await;
            assert_eq!(answer.status, 403, "{host} {path}");
            assert_eq!(answer.code(), "host_not_allowed");
        }
        let head =
            format!("GET /ws HTTP/1.1\r\nhost: {host}\r\norigin: http://{host}\r\n{WS_UPGRADE}");
        assert_eq!(send(addr, &head, "").await.status, 403, "{host}");
        let head = format!(
            "PUT /admin/policy HTTP/1.1\r\nhost: {host}\r\norigin: http://{host}\r\ncontent-type: application/json\r\n"
        );
        assert_eq!(send(addr, &head, r#"{"min_load_gap":7}"#).await.status, 403);
    }
    assert_eq!(min_load_gap(&gateway).await, gateway_default_gap());
    // Its own names, any port (an SSH tunnel changes it), and the configured one.
    for host in [
        format!("{addr}"),
        format!("localhost:{port}"),
        "LOCALHOST.:19090".to_owned(),
        "127.0.0.1".to_owned(),
        format!("console.bch.invalid:{port}"),
    ] {
        let answer = send(
            addr,
            &format!("GET /admin/workers HTTP/1.1\r\nhost: {host}\r\n"),
            "",
        )
        .await;
        assert_eq!(answer.status, 200, "{host}");
    }
    // The configured origin may use it from its page, websocket included.
    let head = format!(
        "GET /ws HTTP/1.1\r\nhost: {addr}\r\norigin: http://console.bch.invalid:3000\r\n{WS_UPGRADE}"
    );
    assert_eq!(send(addr, &head, "").await.status, 101);
    let head = format!(
        "PUT /admin/policy HTTP/1.1\r\nhost: {addr}\r\norigin: HTTP://console.bch.invalid:3000\r\ncontent-type: application/json\r\n"
    );
    assert_eq!(send(addr, &head, r#"{"min_load_gap":5}"#).await.status, 200);
    // HTTP/1.1 must name a host; HTTP/1.0 (which no browser sends) need not.
    let answer = send(addr, "GET /admin/policy HTTP/1.1\r\n", "").await;
    assert_eq!((answer.status, answer.code()), (400, "missing_host".into()));
    assert_eq!(
        send(addr, "GET /admin/policy HTTP/1.0\r\n", "")
            .await
            .status,
        200
    );
    gateway.shutdown().await;
}

/// With a token the bearer check answers first, exactly as before (401 for anything without the
/// token, a foreign Origin included); with the token any `Host` is fine (such a control plane may
/// listen on every interface), but writes still take JSON and a foreign page is still refused.
#[tokio::test]
async fn the_token_instance_keeps_refusing_what_it_refused() {
    let a = fake_worker("a").await;
    let token_file = std::env::temp_dir().join(format!("bch-guard-token-{}", std::process::id()));
    std::fs::write(&token_file, "guard-token\n").unwrap();
    let mut config = test_config(&[&a]);
    config.server.control_access.admin_token_file = Some(token_file.clone());
    let gateway = start(config).await;
    let addr = gateway.control_addr;
    let bearer = "authorization: Bearer guard-token\r\n";
    for head in [
        "GET /admin/workers HTTP/1.1\r\nhost: attacker.example\r\n".to_owned(),
        format!("GET /ws HTTP/1.1\r\nhost: {addr}\r\norigin: {EVIL}\r\n{WS_UPGRADE}"),
        format!(
            "POST /admin/workers HTTP/1.1\r\nhost: {addr}\r\norigin: {EVIL}\r\ncontent-type: text/plain\r\n"
        ),
        "GET /admin/workers HTTP/1.1\r\n".to_owned(),
    ] {
        let answer = send(addr, &head, "{}").await;
        assert_eq!(answer.status, 401, "{head}");
        assert!(answer.head.contains("www-authenticate: bearer"));
    }
    let answer = send(
        addr,
        &format!("GET /admin/workers HTTP/1.1\r\nhost: gw.bch.invalid:9090\r\n{bearer}"),
        "",
    )
    .await;
    assert_eq!(answer.status, 200);
    let head = format!(
        "PUT /admin/policy HTTP/1.1\r\nhost: {addr}\r\n{bearer}content-type: text/plain\r\n"
    );
    assert_eq!(send(addr, &head, r#"{"min_load_gap":7}"#).await.status, 415);
    let head =
        format!("GET /ws HTTP/1.1\r\nhost: {addr}\r\n{bearer}origin: {EVIL}\r\n{WS_UPGRADE}");
    assert_eq!(send(addr, &head, "").await.status, 403);
    let answer = send(addr, &format!("GET /admin/policy HTTP/1.1\r\n{bearer}"), "").await;
    assert_eq!((answer.status, answer.code()), (400, "missing_host".into()));
    assert_eq!(min_load_gap(&gateway).await, gateway_default_gap());
    gateway.shutdown().await;
    let _ = std::fs::remove_file(token_file);
}

/// Every control plane refusal is OpenAI-shaped, including a method the endpoint does not take
/// (405, with `Allow`) and a body over the control plane's limit (413).
#[tokio::test]
async fn method_and_size_refusals_are_openai_shaped() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let addr = gateway.control_addr;
    let host = format!("host: {addr}\r\n");
    for (method, path, allow) in [
        ("POST", "/admin/policy", "get,head,put"),
        ("DELETE", "/metrics", "get,head"),
        ("PUT", "/admin/workers", "get,head,post"),
        ("GET", "/admin/reload", "post"),
    ] {
        let answer = send(addr, &format!("{method} {path} HTTP/1.1\r\n{host}"), "").await;
        assert_eq!(answer.status, 405, "{method} {path}");
        assert_eq!(answer.code(), "method_not_allowed");
        assert!(
            answer.head.contains(&format!("allow: {allow}")),
            "{}",
            answer.head
        );
    }
    let big = format!(
        r#"{{"url":"http://127.0.0.1:1","name":"{}"}}"#,
        "x".repeat(100 << 10)
    );
    let head = format!("POST /admin/workers HTTP/1.1\r\n{host}content-type: application/json\r\n");
    let answer = send(addr, &head, &big).await;
    assert_eq!(
        (answer.status, answer.code()),
        (413, "payload_too_large".into())
    );
    assert_eq!(worker_count(&gateway).await, 1);
    gateway.shutdown().await;
}
