//! The workers endpoints: list, add and remove, refused URLs, and path tricks that change nothing.

use crate::common::*;
use serde_json::{Value, json};

use super::*;

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
        (json!({"name": "d", "url": "ftp://127.0.0.1:1"}), "url"),
        (
            json!({"name": "d", "url": "http://127.0.0.1:1", "server_name": "d.test"}),
            "server_name",
        ),
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
        let (status, response) = raw::exchange(gateway.control_addr, request.as_bytes())
            .await
            .complete();
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

/// Names that could spoof or garble a log line, a metric label or a listing (a bidirectional
/// override, a line or paragraph separator, a byte-order mark, a space, control characters,
/// zero-width and non-ASCII letters) are refused with a `400` naming the `name` field, the
/// character quoted escaped; nothing is added. The configuration file and discovery use the same
/// grammar.
#[tokio::test]
async fn worker_names_outside_the_grammar_are_refused_naming_the_field() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    for (name, shown) in [
        ("gpu\u{202e}1-upg", "\\u{202e}"),
        ("gpu\u{2028}status=500", "\\u{2028}"),
        ("gpu\u{2029}1", "\\u{2029}"),
        ("\u{feff}gpu-1", "\\u{feff}"),
        ("gpu 1", "' '"),
        ("gpu\t1", "'\\t'"),
        ("gpu\r\n1", "'\\r'"),
        ("gpu\u{1b}[31m", "\\u{1b}"),
        ("gpu\u{85}1", "\\u{85}"),
        ("gpu\u{200b}1", "\\u{200b}"),
        ("gpu\u{430}", "'\u{430}'"),
        ("gpu\"1", "'\"'"),
    ] {
        let response = client
            .post(control(&gateway, "/admin/workers"))
            .json(&json!({"name": name, "url": "http://127.0.0.9:1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{name:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_worker", "{name:?}: {body}");
        let message = error_message(&body);
        assert!(message.starts_with("name: "), "{name:?}: {message}");
        assert!(message.contains(shown), "{name:?}: {message}");
    }
    assert_eq!(worker_names(&gateway).await, ["a"]);
    gateway.shutdown().await;
}
