//! Control plane integration tests: the admin API, bearer-token auth, reload, explain, metrics and
//! health probes, against a real gateway and real fake workers on loopback (docs/api.md).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTING_KEY: &str = "x-smg-routing-key";
const TARGET: &str = "x-smg-target-worker";
const TOKEN: &str = "s3cret-token-for-tests";

/// A file in the temp dir with a unique name, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, contents: &str) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = std::env::temp_dir().join(format!(
            "bch-control-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    fn write(&self, contents: &str) {
        std::fs::write(&self.0, contents).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn control(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.control_addr)
}

fn data(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.data_addr)
}

async fn get_json(url: &str) -> Value {
    let response = client().get(url).send().await.unwrap();
    assert_eq!(response.status(), 200, "GET {url}");
    response.json().await.unwrap()
}

async fn policy(gateway: &RunningGateway) -> Value {
    get_json(&control(gateway, "/admin/policy")).await
}

async fn workers(gateway: &RunningGateway) -> Vec<Value> {
    get_json(&control(gateway, "/admin/workers")).await["workers"]
        .as_array()
        .unwrap()
        .clone()
}

async fn worker_names(gateway: &RunningGateway) -> Vec<String> {
    workers(gateway)
        .await
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn healthy(gateway: &RunningGateway, name: &str) -> bool {
    workers(gateway)
        .await
        .iter()
        .find(|w| w["name"] == name)
        .unwrap_or_else(|| panic!("no worker {name}"))["healthy"]
        .as_bool()
        .unwrap()
}

/// Asserts the OpenAI error shape and returns the message.
fn error_message(body: &Value) -> String {
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error["code"].is_string(), "{body}");
    error["message"].as_str().unwrap().to_owned()
}

/// Sends `request` verbatim (no client-side path normalisation) and returns status and body.
async fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .expect("response in time")
        .unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Polls `$cond` (an expression reading the API, may `.await`) until it holds; panics after a
/// bounded deadline.
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if $cond {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {}",
                $what
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }};
}

// ---------------------------------------------------------------------------------------------
// Auth

#[tokio::test]
async fn every_control_endpoint_needs_the_token_when_one_is_set() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let token = TempFile::new("token", &format!("  {TOKEN}\n"));
    let mut config = test_config(&[&a, &b]);
    config.server.admin_token_file = Some(token.path().to_owned());
    let gateway = start(config).await;
    let client = client();
    let extra = fake_worker("c").await;
    let endpoints: Vec<(reqwest::Method, &str, Option<Value>)> = vec![
        (reqwest::Method::GET, "/metrics", None),
        (reqwest::Method::GET, "/admin/workers", None),
        (
            reqwest::Method::POST,
            "/admin/workers",
            Some(json!({"name": "c", "url": extra.url()})),
        ),
        (reqwest::Method::DELETE, "/admin/workers/a", None),
        (reqwest::Method::GET, "/admin/policy", None),
        (
            reqwest::Method::PUT,
            "/admin/policy",
            Some(json!({"min_load_gap": 7})),
        ),
        (reqwest::Method::GET, "/admin/explain?routing_key=k", None),
        (reqwest::Method::POST, "/admin/reload", None),
        (reqwest::Method::GET, "/ws", None),
        (reqwest::Method::GET, "/no/such/endpoint", None),
    ];
    let wrong = [
        None,
        Some("Bearer wrong".to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_owned()),
        Some("Bearer ".to_owned()),
    ];
    for (method, path, body) in &endpoints {
        for authorization in &wrong {
            let mut request = client.request(method.clone(), control(&gateway, path));
            if let Some(value) = authorization {
                request = request.header("authorization", value);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response.status(),
                401,
                "{method} {path} with {authorization:?}"
            );
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
            let body: Value = response.json().await.unwrap();
            error_message(&body);
        }
    }
    // Nothing the refused requests asked for happened.
    let authed = |r: reqwest::RequestBuilder| r.bearer_auth(TOKEN);
    let listed: Value = authed(client.get(control(&gateway, "/admin/workers")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    // The scheme is case-insensitive (RFC 9110), the token is not.
    for authorization in [format!("bearer {TOKEN}"), format!("BEARER {TOKEN}")] {
        let response = client
            .get(control(&gateway, "/admin/policy"))
            .header("authorization", &authorization)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{authorization}");
    }
    let response = client
        .get(control(&gateway, "/admin/policy"))
        .bearer_auth(TOKEN.to_uppercase())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    // The right token opens every endpoint.
    for path in [
        "/metrics",
        "/admin/workers",
        "/admin/policy",
        "/admin/explain?routing_key=k",
    ] {
        let response = authed(client.get(control(&gateway, path)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "GET {path}");
    }
    let put = authed(client.put(control(&gateway, "/admin/policy")))
        .json(&json!({"min_load_gap": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let added = authed(client.post(control(&gateway, "/admin/workers")))
        .json(&json!({"name": "c", "url": extra.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let removed = authed(client.delete(control(&gateway, "/admin/workers/c")))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    // Started without a config file: reload is a conflict, but it got past auth.
    let reload = authed(client.post(control(&gateway, "/admin/reload")))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 409);
    // The data plane needs no token.
    let response = client
        .get(data(&gateway, "/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = client.get(data(&gateway, "/health")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    gateway.shutdown().await;
}

#[tokio::test]
async fn non_loopback_control_plane_needs_a_token() {
    let a = fake_worker("a").await;
    let mut config = test_config(&[&a]);
    config.server.control_listen = "0.0.0.0:0".parse().unwrap();
    let error = match gatewayd::start(gatewayd::StartOptions::new(config.clone())).await {
        Ok(_) => panic!("a non-loopback control plane without a token must be refused"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("admin_token_file") && error.contains("0.0.0.0"),
        "{error}"
    );

    let empty = TempFile::new("empty-token", " \n");
    config.server.admin_token_file = Some(empty.path().to_owned());
    let error = match gatewayd::start(gatewayd::StartOptions::new(config.clone())).await {
        Ok(_) => panic!("an empty token must be refused"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("empty"), "{error}");

    let token = TempFile::new("token", TOKEN);
    config.server.admin_token_file = Some(token.path().to_owned());
    let gateway = start(config).await;
    // Only ever talked to over loopback, and only for a moment.
    let url = format!(
        "http://127.0.0.1:{}/admin/policy",
        gateway.control_addr.port()
    );
    let refused = client().get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let response = client().get(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(response.status(), 200);
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Policy

#[tokio::test]
async fn policy_get_and_put() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let client = client();
    let initial = policy(&gateway).await;
    assert_eq!(
        initial,
        json!({"kind": "consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.5,
            "spill_order": "ring", "virtual_nodes": 150, "load_source": "local"})
    );

    // A subset applies and the answer is the whole result.
    let put = |body: &str| {
        client
            .put(control(&gateway, "/admin/policy"))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };
    let response = put(r#"{"min_load_gap": 4}"#).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut answer: Value = response.json().await.unwrap();
    // The answer says the change is not persisted, and how to persist it.
    let note = answer["note"].take();
    assert!(
        note.as_str().unwrap().contains("lost on the next reload")
            && note.as_str().unwrap().contains("GET /admin/config"),
        "{note}"
    );
    answer.as_object_mut().unwrap().remove("note");
    assert_eq!(
        answer,
        json!({"kind": "consistent_hashing", "min_load_gap": 4, "max_load_skew": 1.5,
            "spill_order": "ring", "virtual_nodes": 150, "load_source": "local"})
    );
    let response = put(
        r#"{"kind": "bounded_consistent_hashing", "max_load_skew": 2.25, "spill_order": "hash_seeded"}"#,
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let good = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 4, "max_load_skew": 2.25,
        "spill_order": "hash_seeded", "virtual_nodes": 150, "load_source": "local"});
    let mut answer = response.json::<Value>().await.unwrap();
    answer.as_object_mut().unwrap().remove("note");
    assert_eq!(answer, good);
    assert_eq!(policy(&gateway).await, good);

    // Bad input: 400 naming the field, and nothing changes (also not the valid half of a patch).
    let bad = [
        ("{", "invalid"),
        ("", "invalid"),
        ("[1]", "invalid"),
        (r#"{"min_load_gaps": 1}"#, "min_load_gaps"),
        (r#"{"max_load_skew": 0.99}"#, "max_load_skew"),
        (r#"{"load_source": "prometheus"}"#, "load_source"),
        (
            r#"{"max_load_skew": 0.5, "min_load_gap": 9}"#,
            "max_load_skew",
        ),
        (
            r#"{"min_load_gap": 9, "max_load_skew": 0.5}"#,
            "max_load_skew",
        ),
        (r#"{"max_load_skew": "NaN"}"#, "max_load_skew"),
        (r#"{"max_load_skew": "inf"}"#, "max_load_skew"),
        (r#"{"max_load_skew": 1e999}"#, "invalid"),
        (r#"{"min_load_gap": -1}"#, "min_load_gap"),
        (r#"{"min_load_gap": 1.5}"#, "min_load_gap"),
        (r#"{"min_load_gap": "3"}"#, "min_load_gap"),
        (r#"{"kind": "strict"}"#, "kind"),
        (r#"{"spill_order": "next"}"#, "spill_order"),
        (
            r#"{"spill_order": "ring", "max_load_skew": 0.5}"#,
            "max_load_skew",
        ),
        (r#"{"virtual_nodes": 0}"#, "virtual_nodes"),
        (r#"{"virtual_nodes": 1000000}"#, "virtual_nodes"),
    ];
    for (body, field) in bad {
        let response = put(body).await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let message = error_message(&response.json().await.unwrap());
        assert!(
            message.contains(field),
            "{body}: {message:?} does not name {field}"
        );
        assert_eq!(policy(&gateway).await, good, "{body} changed the policy");
    }

    // Round robin ignores the key: the same key visits both workers.
    let response = put(r#"{"kind": "round_robin"}"#).await.unwrap();
    assert_eq!(
        response.json::<Value>().await.unwrap()["kind"],
        "round_robin"
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let response = client
            .get(data(&gateway, "/v1/models"))
            .header(ROUTING_KEY, "one-key")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        seen.insert(
            response.headers()["x-bch-worker"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn changing_virtual_nodes_rebuilds_the_ring() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let gateway = start(test_config(&[&a, &b, &c])).await;
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut before = Vec::new();
    for key in &keys {
        before.push(preferred_worker(&gateway, key).await);
    }
    let response = client()
        .put(control(&gateway, "/admin/policy"))
        .json(&json!({"virtual_nodes": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(policy(&gateway).await["virtual_nodes"], 1);
    let mut after = Vec::new();
    for key in &keys {
        after.push(preferred_worker(&gateway, key).await);
    }
    let moved = before.iter().zip(&after).filter(|(x, y)| x != y).count();
    assert!(moved > 0, "no key moved with 1 virtual node instead of 150");
    // Requests follow the new ring.
    let response = client()
        .get(data(&gateway, "/v1/models"))
        .header(ROUTING_KEY, keys[0].as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-bch-worker"], after[0].as_str());
    // The ring is a pure function of members and virtual nodes: going back restores placement.
    client()
        .put(control(&gateway, "/admin/policy"))
        .json(&json!({"virtual_nodes": 150}))
        .send()
        .await
        .unwrap();
    let mut restored = Vec::new();
    for key in &keys {
        restored.push(preferred_worker(&gateway, key).await);
    }
    assert_eq!(restored, before);
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Workers

#[tokio::test]
async fn workers_list_add_remove() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let gateway = start(test_config(&[&a, &b])).await;
    let client = client();
    let listed = workers(&gateway).await;
    assert_eq!(listed.len(), 2);
    let mut keys: Vec<&str> = listed[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "active",
            "errors_total",
            "healthy",
            "load",
            "load_stale",
            "name",
            "requests_total",
            "source",
            "spilled_in_total",
            "spilled_out_total",
            "state",
            "url"
        ]
    );
    assert_eq!(listed[0]["state"], "active");
    assert_eq!(listed[0]["source"], "static");
    assert_eq!(listed[0]["name"], "a");
    assert_eq!(listed[0]["url"], a.url().as_str());
    assert_eq!(listed[0]["healthy"], true);
    assert_eq!(listed[0]["active"], 0);

    let post = |body: Value| {
        client
            .post(control(&gateway, "/admin/workers"))
            .json(&body)
            .send()
    };
    let response = post(json!({"name": "c", "url": c.url()})).await.unwrap();
    assert_eq!(response.status(), 201);
    let record: Value = response.json().await.unwrap();
    assert_eq!(record["name"], "c");
    assert_eq!(record["url"], c.url().as_str());
    assert_eq!(worker_names(&gateway).await, ["a", "b", "c"]);
    // The new worker takes traffic.
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header(TARGET, "c")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-worker-name"], "c");

    let conflicts = [
        json!({"name": "c", "url": "http://127.0.0.1:1"}),
        json!({"name": "other", "url": c.url()}),
        json!({"url": c.url()}),
    ];
    for body in conflicts {
        let response = post(body.clone()).await.unwrap();
        assert_eq!(response.status(), 409, "{body}");
        error_message(&response.json().await.unwrap());
    }
    let invalid = [
        (json!({"name": "d", "url": "not a url"}), "url"),
        (json!({"name": "d", "url": "https://127.0.0.1:1"}), "url"),
        (json!({"name": "d", "url": "http://127.0.0.1:1?x=1"}), "url"),
        (json!({"name": "d"}), "url"),
        (json!({"name": "", "url": "http://127.0.0.1:1"}), "name"),
        (json!({"name": "a/b", "url": "http://127.0.0.1:1"}), "name"),
        (
            json!({"name": "d", "url": "http://127.0.0.1:1", "health_path": "health"}),
            "health_path",
        ),
        (
            json!({"name": "d", "url": "http://127.0.0.1:1", "weight": 2}),
            "weight",
        ),
        (json!({"name": 5, "url": "http://127.0.0.1:1"}), "name"),
    ];
    for (body, field) in invalid {
        let response = post(body.clone()).await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let message = error_message(&response.json().await.unwrap());
        assert!(message.contains(field), "{body}: {message:?}");
    }
    assert_eq!(worker_names(&gateway).await, ["a", "b", "c"]);

    let response = client
        .delete(control(&gateway, "/admin/workers/c"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(worker_names(&gateway).await, ["a", "b"]);
    for name in ["c", "nope"] {
        let response = client
            .delete(control(&gateway, &format!("/admin/workers/{name}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{name}");
        error_message(&response.json().await.unwrap());
    }
    gateway.shutdown().await;
}

/// Worker URLs the admin API refuses: credentials (without echoing them), ports outside
/// 1..=65535, a fragment, another spelling of a registered backend, this gateway's own listeners,
/// and names no client can address. Nothing is added; a different host or prefix is still a
/// different worker.
#[tokio::test]
async fn bad_alias_and_looping_worker_urls_are_refused() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    let post = |body: Value| {
        client
            .post(control(&gateway, "/admin/workers"))
            .json(&body)
            .send()
    };
    let port = a.addr.port();
    let refused = [
        (
            format!("http://user:s3cret@127.0.0.1:{port}"),
            400,
            "credentials",
        ),
        ("http://127.0.0.1:0".to_owned(), 400, "port"),
        ("http://127.0.0.1:99999".to_owned(), 400, "port"),
        ("http://127.0.0.1:65536".to_owned(), 400, "port"),
        (format!("http://127.0.0.1:{port}/#frag"), 400, "fragment"),
        (format!("HTTP://127.0.0.1:{port}"), 409, "same backend"),
        (format!("http://127.0.0.1:{port}/"), 409, "same backend"),
        (format!("http://localhost:{port}"), 409, "same backend"),
        (format!("http://0x7f.1:{port}"), 409, "same backend"),
        (format!("http://2130706433:{port}"), 409, "same backend"),
        (
            format!("http://[::ffff:127.0.0.1]:{port}"),
            409,
            "same backend",
        ),
        (format!("http://{}", gateway.data_addr), 400, "loop"),
        (
            format!("http://localhost:{}/v1", gateway.data_addr.port()),
            400,
            "loop",
        ),
        (format!("http://{}", gateway.control_addr), 400, "loop"),
    ];
    for (index, (url, status, needle)) in refused.iter().enumerate() {
        let response = post(json!({"name": format!("w{index}"), "url": url}))
            .await
            .unwrap();
        assert_eq!(response.status(), *status, "{url}");
        let message = error_message(&response.json().await.unwrap());
        assert!(message.starts_with("url: "), "{url}: {message}");
        assert!(message.contains(needle), "{url}: {message}");
        assert!(!message.contains("s3cret"), "{url}: {message}");
    }
    for name in [".", ".."] {
        let response = post(json!({"name": name, "url": "http://127.0.0.9:1"}))
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{name}");
        assert!(error_message(&response.json().await.unwrap()).starts_with("name: "));
    }
    let listed = workers(&gateway).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(
        !listed
            .iter()
            .any(|w| w["url"].as_str().unwrap().contains("s3cret"))
    );
    // Not aliases: another loopback address, another path prefix. The ring identity stays the URL
    // as written.
    for (name, url) in [
        ("other-host", format!("http://127.0.0.2:{port}")),
        ("other-prefix", format!("http://127.0.0.1:{port}/v2/")),
    ] {
        let response = post(json!({"name": name, "url": url})).await.unwrap();
        assert_eq!(response.status(), 201, "{url}");
        assert_eq!(response.json::<Value>().await.unwrap()["url"], url.as_str());
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn path_tricks_on_the_admin_api_change_nothing() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let policy_before = policy(&gateway).await;
    let attempts = [
        "DELETE /admin/workers/..%2Fpolicy",
        "DELETE /admin/workers/..%2F..%2Fadmin%2Fworkers%2Fa",
        "DELETE /admin/workers/%2e%2e",
        "DELETE /admin/workers/..",
        "DELETE /admin/workers/a%2F..%2Fb",
        "DELETE /admin/workers/a/",
        "DELETE /admin/workers/a/../b",
        "DELETE /admin/../admin/workers/a/x",
        "PUT /admin/../admin/policy",
        "PUT /admin/workers/..%2Fpolicy",
        "PUT /admin/%2e%2e/admin/policy",
        "POST /admin/workers/../reload",
        "GET /admin/workers/%00",
        "DELETE /admin/workers/%00",
    ];
    for attempt in attempts {
        let (method, path) = attempt.split_once(' ').unwrap();
        let body = r#"{"min_load_gap":9,"kind":"round_robin"}"#;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (status, response) = raw(gateway.control_addr, &request).await;
        assert!(
            (400..500).contains(&status),
            "{attempt}: {status} {response}"
        );
    }
    assert_eq!(worker_names(&gateway).await, ["a", "b"]);
    assert_eq!(policy(&gateway).await, policy_before);
    let response = client()
        .get(data(&gateway, "/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = client()
        .get(data(&gateway, "/v1/models"))
        .header(ROUTING_KEY, "k")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Explain

#[tokio::test]
async fn explain_answers_without_reserving_load() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let mut config = test_config(&[&a, &b]);
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    let gateway = start(config).await;
    let client = client();

    let mut first = None;
    for _ in 0..20 {
        let answer = get_json(&control(&gateway, "/admin/explain?routing_key=session-1")).await;
        assert_eq!(answer["branch"], "explicit_routing_key_hit", "{answer}");
        assert!(answer["worker"].is_string(), "{answer}");
        assert_eq!(answer["worker"], answer["preferred"], "{answer}");
        assert!(answer["bound"].is_object(), "{answer}");
        assert_eq!(answer["policy"]["kind"], "bounded_consistent_hashing");
        if let Some(first) = &first {
            assert_eq!(&answer, first, "an idle fleet gives the same answer");
        }
        first = Some(answer);
    }
    for worker in workers(&gateway).await {
        assert_eq!(worker["active"], 0, "{worker}");
        assert_eq!(worker["requests_total"], 0, "{worker}");
    }
    let first = first.unwrap();
    // A real request goes where explain said.
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header(ROUTING_KEY, "session-1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-bch-worker"],
        first["worker"].as_str().unwrap()
    );

    // Implicit: the same hashing as an Authorization header, never spills.
    let implicit = get_json(&control(
        &gateway,
        "/admin/explain?routing_key=Bearer%20abc&explicit=false",
    ))
    .await;
    assert_eq!(implicit["branch"], "implicit_routing_key_hit", "{implicit}");
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header("authorization", "Bearer abc")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-bch-branch"],
        "implicit_routing_key_hit"
    );
    assert_eq!(
        response.headers()["x-bch-worker"],
        implicit["worker"].as_str().unwrap()
    );

    let target = get_json(&control(&gateway, "/admin/explain?target_worker=b")).await;
    assert_eq!(target["branch"], "target_worker_hit");
    assert_eq!(target["worker"], "b");
    let by_index = get_json(&control(&gateway, "/admin/explain?target_worker=0")).await;
    assert_eq!(by_index["worker"], "a");
    let miss = get_json(&control(&gateway, "/admin/explain?target_worker=zzz")).await;
    assert_eq!(miss["branch"], "target_worker_miss");
    assert!(miss["worker"].is_null());

    let keyless = get_json(&control(&gateway, "/admin/explain")).await;
    assert_eq!(keyless["branch"], "keyless");

    for bad in [
        "/admin/explain?routing_key=k&bogus=1",
        "/admin/explain?routing_key=k&explicit=maybe",
        "/admin/explain?routing_key=",
        // Not UTF-8 once decoded: the data plane ignores such a header, so explain refuses it too
        // rather than answering for a repaired key.
        "/admin/explain?routing_key=%FF%FE",
        // Bytes no header can carry, so no request has such a key; a repeated parameter would
        // explain one of two keys.
        "/admin/explain?routing_key=a%00b",
        "/admin/explain?routing_key=a%0D%0Ax-smg-target-worker:%20b",
        "/admin/explain?routing_key=a%0Ab",
        "/admin/explain?routing_key=%20padded",
        "/admin/explain?routing_key=a%00b&explicit=false",
        "/admin/explain?target_worker=a%0D%0A",
        "/admin/explain?routing_key=one&routing_key=two",
        "/admin/explain?routing_key=k&explicit=true&explicit=false",
        "/admin/explain?target_worker=a&target_worker=b",
    ] {
        let response = client.get(control(&gateway, bad)).send().await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
        error_message(&response.json().await.unwrap());
    }
    let long = "k".repeat(129);
    let response = client
        .get(control(
            &gateway,
            &format!("/admin/explain?routing_key={long}"),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    // Every explain above left the counters alone.
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    let total: u64 = workers(&gateway)
        .await
        .iter()
        .map(|w| w["requests_total"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 2, "only the two real requests were counted");
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Reload

fn config_text(gap: u64, skew: &str, workers: &[(&str, &FakeWorker)]) -> String {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"127.0.0.1:0\"\n\n\
         [health]\ninterval_ms = 100\ntimeout_ms = 500\n\n\
         [policy]\nkind = \"bounded_consistent_hashing\"\nmin_load_gap = {gap}\nmax_load_skew = {skew}\n"
    );
    for (name, worker) in workers {
        text.push_str(&format!(
            "\n[[workers]]\nname = \"{name}\"\nurl = \"{}\"\n",
            worker.url()
        ));
    }
    text
}

#[tokio::test]
async fn reload_applies_a_good_file_and_refuses_a_bad_one() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let file = TempFile::new("reload", &config_text(2, "1.5", &[("a", &a)]));
    let config = Config::load(file.path()).unwrap();
    let gateway =
        gatewayd::start(gatewayd::StartOptions::new(config).config_file(file.path().to_owned()))
            .await
            .unwrap();
    let client = client();
    let reload = || client.post(control(&gateway, "/admin/reload")).send();
    assert_eq!(worker_names(&gateway).await, ["a"]);
    assert_eq!(policy(&gateway).await["min_load_gap"], 2);

    file.write(&config_text(5, "1.75", &[("a", &a), ("b", &b)]).replacen(
        "[policy]\n",
        "[policy]\nspill_order = \"hash_seeded\"\n",
        1,
    ));
    let response = reload().await.unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["policy"]["min_load_gap"], 5);
    let applied = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 5, "max_load_skew": 1.75,
        "spill_order": "hash_seeded", "virtual_nodes": 150, "load_source": "local"});
    assert_eq!(policy(&gateway).await, applied);
    assert_eq!(worker_names(&gateway).await, ["a", "b"]);
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header(TARGET, "b")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-worker-name"], "b");

    // The file is the source of truth for membership: a worker added over the API is gone after a
    // reload that does not list it.
    let added = client
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "c", "url": c.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let response = reload().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(worker_names(&gateway).await, ["a", "b"]);

    // Bad files: 400 naming the field or line; nothing changes (also not the valid parts).
    let bad = [
        (config_text(7, "0.5", &[("a", &a)]), "policy.max_load_skew"),
        (config_text(7, "nan", &[("a", &a)]), "policy.max_load_skew"),
        (
            config_text(7, "1.5", &[("a", &a), ("a", &b)]),
            "workers[1].name",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]) + "\n[[workers]]\nurl = \"nope\"\n",
            "workers[1].url",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]).replace("[policy]", "[policy"),
            "line",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]).replacen(
                "[policy]\n",
                "[policy]\nspill_order = \"next\"\n",
                1,
            ),
            "spill_order",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]) + "\n[log]\nlevels = \"debug\"\n",
            "levels",
        ),
    ];
    for (text, needle) in bad {
        file.write(&text);
        let response = reload().await.unwrap();
        assert_eq!(response.status(), 400, "{text}");
        let message = error_message(&response.json().await.unwrap());
        assert!(
            message.contains(needle),
            "{message:?} does not name {needle}"
        );
        assert_eq!(policy(&gateway).await, applied);
        assert_eq!(worker_names(&gateway).await, ["a", "b"]);
    }
    // A file that disappeared is an error too, and changes nothing.
    let path = file.path().to_owned();
    std::fs::remove_file(&path).unwrap();
    let response = reload().await.unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(policy(&gateway).await, applied);
    gateway.shutdown().await;
}

#[tokio::test]
async fn reload_without_a_config_file_is_a_conflict() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let response = client()
        .post(control(&gateway, "/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    let message = error_message(&response.json().await.unwrap());
    assert!(message.contains("--config"), "{message}");
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// The value of the first sample of `name` whose labels contain `labels`.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            let series_name = series.split('{').next().unwrap();
            series_name == name && series.contains(labels)
        })
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

async fn scrape(gateway: &RunningGateway) -> String {
    let response = client()
        .get(control(gateway, "/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

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

// ---------------------------------------------------------------------------------------------
// Health

/// A worker whose `/health` counts probes and fails while `fail` is set; everything else is 200.
struct ProbeCounter {
    addr: SocketAddr,
    probes: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    fail: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProbeCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn probe_counter() -> ProbeCounter {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let probes = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let (p, f, x) = (probes.clone(), failed.clone(), fail.clone());
    let app = axum::Router::new()
        .route(
            "/health",
            axum::routing::get(move || {
                let (p, f, x) = (p.clone(), f.clone(), x.clone());
                async move {
                    p.fetch_add(1, Ordering::SeqCst);
                    if x.load(Ordering::SeqCst) {
                        f.fetch_add(1, Ordering::SeqCst);
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            }),
        )
        .fallback(|| async { "ok" });
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    ProbeCounter {
        addr,
        probes,
        failed,
        fail,
        task,
    }
}

#[tokio::test]
async fn health_probes_flip_a_worker_without_moving_other_keys() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let sick = probe_counter().await;
    let mut config = test_config(&[&a, &b]);
    // Only answered probes may count as failures here, so a slow machine must not time one out.
    config.health.timeout_ms = 5_000;
    config.workers.push(WorkerConfig {
        name: Some("sick".into()),
        url: format!("http://{}", sick.addr),
        ring_id: None,
        health_path: None,
        metrics_path: None,
    });
    let gateway = start(config).await;
    let keys: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    let mut before = Vec::new();
    for key in &keys {
        before.push(preferred_worker(&gateway, key).await);
    }
    assert!(before.iter().any(|w| w == "sick"), "{before:?}");
    assert!(before.iter().any(|w| w != "sick"), "{before:?}");

    // Unhealthy only after three consecutive failed probes: whenever the API shows it unhealthy,
    // the worker has already failed at least three.
    sick.fail.store(true, Ordering::SeqCst);
    eventually!("sick marked unhealthy", {
        let unhealthy = !healthy(&gateway, "sick").await;
        if unhealthy {
            let failed = sick.failed.load(Ordering::SeqCst);
            assert!(failed >= 3, "unhealthy after only {failed} failed probes");
        }
        unhealthy
    });
    assert!(healthy(&gateway, "a").await && healthy(&gateway, "b").await);
    // Health is a filter on the ring walk, not a rebuild: keys of healthy workers stay put and
    // the sick worker's keys move to the next healthy worker.
    for (key, home) in keys.iter().zip(&before) {
        let now = preferred_worker(&gateway, key).await;
        if home == "sick" {
            assert_ne!(now, "sick", "{key}");
        } else {
            assert_eq!(&now, home, "{key} moved although {home} is healthy");
        }
    }
    let metrics = scrape(&gateway).await;
    assert_eq!(
        sample(&metrics, "bch_worker_healthy", "worker=\"sick\""),
        Some(0.0)
    );
    // Target requests to an unhealthy worker get 503, never another worker.
    let response = client()
        .get(data(&gateway, "/v1/models"))
        .header(TARGET, "sick")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);

    // Back after two consecutive successes.
    let probes_at_recovery = sick.probes.load(Ordering::SeqCst);
    sick.fail.store(false, Ordering::SeqCst);
    eventually!("sick healthy again", {
        let back = healthy(&gateway, "sick").await;
        if back {
            let successes = sick.probes.load(Ordering::SeqCst) - probes_at_recovery;
            assert!(successes >= 2, "healthy after only {successes} probes");
        }
        back
    });
    let mut after = Vec::new();
    for key in &keys {
        after.push(preferred_worker(&gateway, key).await);
    }
    assert_eq!(after, before, "every key is home again");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_worker_health_path_is_probed_instead_of_the_default() {
    let plain = fake_worker("plain").await;
    let custom = fake_worker("custom").await;
    let added = fake_worker("added").await;
    // All three fail /health; only `plain` is probed there.
    for w in [&plain, &custom, &added] {
        w.state.fail_health.store(true, Ordering::SeqCst);
    }
    let mut config = test_config(&[&plain, &custom]);
    config.workers[1].health_path = Some("/echo".into());
    let gateway = start(config).await;
    let response = client()
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "added", "url": added.url(), "health_path": "/echo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    eventually!("plain marked unhealthy", !healthy(&gateway, "plain").await);
    // By now several probe rounds have run; the workers with their own path were probed there
    // (the fake worker's /echo counts requests) and stayed healthy.
    eventually!(
        "probes reach /echo",
        custom.state.requests.load(Ordering::SeqCst) >= 3
            && added.state.requests.load(Ordering::SeqCst) >= 3
    );
    assert!(healthy(&gateway, "custom").await);
    assert!(healthy(&gateway, "added").await);
    assert_eq!(plain.state.requests.load(Ordering::SeqCst), 0);
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Credentials and the configuration in force

#[tokio::test]
async fn the_metrics_token_opens_metrics_and_nothing_else() {
    let a = fake_worker("a").await;
    let admin = TempFile::new("admin-token", TOKEN);
    let scraper = TempFile::new("metrics-token", "scrape-only-token\n");
    let mut config = test_config(&[&a]);
    config.server.admin_token_file = Some(admin.path().to_owned());
    config.server.metrics_token_file = Some(scraper.path().to_owned());
    let gateway = start(config).await;
    let client = client();
    let with = |path: &str, token: &str| {
        client
            .get(control(&gateway, path))
            .bearer_auth(token.to_owned())
            .send()
    };
    assert_eq!(
        with("/metrics", "scrape-only-token")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        with("/metrics", TOKEN).await.unwrap().status(),
        200,
        "the admin token too"
    );
    for path in ["/admin/workers", "/admin/policy", "/admin/config", "/ws"] {
        assert_eq!(
            with(path, "scrape-only-token").await.unwrap().status(),
            401,
            "{path} with the metrics token"
        );
    }
    let put = client
        .put(control(&gateway, "/admin/policy"))
        .bearer_auth("scrape-only-token")
        .body(r#"{"min_load_gap":9}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 401);
    gateway.shutdown().await;

    // Without an admin token a metrics token protects nothing: refused at start-up.
    let mut config = test_config(&[&a]);
    config.server.metrics_token_file = Some(scraper.path().to_owned());
    let error = match gatewayd::start(gatewayd::StartOptions::new(config)).await {
        Ok(_) => panic!("a metrics token without an admin token must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("server.metrics_token_file"), "{error}");
}

#[tokio::test]
async fn the_configuration_in_force_comes_back_as_toml_with_runtime_changes() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    let put = client
        .put(control(&gateway, "/admin/policy"))
        .header("content-type", "application/json")
        .body(r#"{"kind":"bounded_consistent_hashing","min_load_gap":6}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let added = client
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "b", "url": b.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let response = client
        .get(control(&gateway, "/admin/config"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/toml")
    );
    let text = response.text().await.unwrap();
    let config: gatewayd::config::Config = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    assert_eq!(config.policy.min_load_gap, 6);
    assert_eq!(
        config.policy.kind,
        bch_core::policy::PolicyKind::BoundedConsistentHashing
    );
    let names: Vec<_> = config
        .workers
        .iter()
        .map(|w| w.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    gateway.shutdown().await;
}
