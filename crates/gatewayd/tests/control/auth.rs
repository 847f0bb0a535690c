//! Bearer-token auth on every control endpoint, the metrics token, and the configuration in force.

use crate::common::*;
use serde_json::{Value, json};

use super::*;

#[tokio::test]
async fn every_control_endpoint_needs_the_token_when_one_is_set() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let token = TempFile::new("token", &format!("  {TOKEN}\n"));
    let mut config = test_config(&[&a, &b]);
    config.server.control_access.admin_token_file = Some(token.path().to_owned());
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
        (reqwest::Method::GET, "/admin/discovery", None),
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
    config.server.listeners.control_listen = "0.0.0.0:0".parse().unwrap();
    let error = match gatewayd::start(gatewayd::StartOptions::new(config.clone())).await {
        Ok(_) => panic!("a non-loopback control plane without a token must be refused"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("admin_token_file") && error.contains("0.0.0.0"),
        "{error}"
    );

    let empty = TempFile::new("empty-token", " \n");
    config.server.control_access.admin_token_file = Some(empty.path().to_owned());
    let error = match gatewayd::start(gatewayd::StartOptions::new(config.clone())).await {
        Ok(_) => panic!("an empty token must be refused"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("empty"), "{error}");

    let token = TempFile::new("token", TOKEN);
    config.server.control_access.admin_token_file = Some(token.path().to_owned());
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
// Credentials and the configuration in force

#[tokio::test]
async fn the_metrics_token_opens_metrics_and_a_read_only_telemetry_and_nothing_else() {
    let a = fake_worker("a").await;
    let admin = TempFile::new("admin-token", TOKEN);
    let scraper = TempFile::new("metrics-token", "scrape-only-token\n");
    let mut config = test_config(&[&a]);
    config.server.control_access.admin_token_file = Some(admin.path().to_owned());
    config.server.control_access.metrics_token_file = Some(scraper.path().to_owned());
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
    // `/ws` opens with it too, read-only (`read_only.rs`).
    for path in ["/admin/workers", "/admin/policy", "/admin/config"] {
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
    config.server.control_access.metrics_token_file = Some(scraper.path().to_owned());
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
