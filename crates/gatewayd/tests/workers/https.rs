//! https workers: the data plane, the health prober and the load scraper reach bch-drill's
//! simulated worker served over TLS, with `[upstream.tls]` trust and (for workers that require one)
//! a client certificate. Every certificate is made here with rcgen; verification is never turned
//! off: each refusal is the real check failing (another CA, an expired certificate, a name the
//! certificate does not carry, no client certificate), and its reason is asserted.

use crate::common;
use crate::dnsmasq::{Dnsmasq, Zone};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bch_core::fleet_load::LoadSource;
use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, server_tls_config, spawn_https_worker};
use bch_tls::test_pki::rcgen::{self, CertificateParams, DnType, ExtendedKeyUsagePurpose};
use bch_tls::test_pki::{self, Authority, Identity};
use common::*;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, DiscoveryConfig, WorkerConfig};
use serde_json::{Value, json};
use tokio::time::Instant;

/// The test's certificates: a CA and what it signed, and a rogue CA's server certificate.
struct Pki {
    /// The files (removed on drop) and the CA.
    files: test_pki::Pki,
    ca_file: PathBuf,
    /// For `127.0.0.1`, signed by the CA.
    server: Identity,
    /// For `gpu-0.test` only, signed by the CA: a worker reached by IP needs `server_name`.
    named: Identity,
    /// For `127.0.0.1`, signed by the CA, expired in 2021.
    expired: Identity,
    /// For `127.0.0.1`, signed by another CA.
    rogue: Identity,
    /// A client certificate signed by the CA.
    client: Identity,
}

/// A server certificate: for server authentication only.
fn server_auth(params: &mut CertificateParams) {
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
}

impl Pki {
    fn new() -> Pki {
        let files = test_pki::Pki::new("bch test CA");
        let ca = files.ca();
        let server = files.issue_by("server", ca, &["127.0.0.1"], server_auth);
        let named = files.issue_by("named", ca, &["gpu-0.test"], server_auth);
        let expired = files.issue_by("expired", ca, &["127.0.0.1"], |params| {
            server_auth(params);
            test_pki::expired(params);
        });
        let rogue_ca = Authority::new("rogue CA");
        let rogue = files.issue_by("rogue", &rogue_ca, &["127.0.0.1"], server_auth);
        let client = files.issue_by("client", ca, &[], |params| {
            params
                .distinguished_name
                .push(DnType::CommonName, "gatewayd");
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        });
        Pki {
            ca_file: files.ca_file(),
            files,
            server,
            named,
            expired,
            rogue,
            client,
        }
    }
}

/// A simulated worker named `name` served over https with `identity`, requiring client
/// certificates from the test CA when `client_ca` is set.
async fn https_worker(pki: &Pki, name: &str, identity: &Identity, client_ca: bool) -> WorkerHandle {
    let client_ca = client_ca.then_some(pki.ca_file.as_path());
    let tls = server_tls_config(&identity.cert, &identity.key, client_ca).unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    spawn_https_worker(addr, name, SimConfig::default().with_time_scale(0.0), tls)
        .await
        .unwrap()
}

/// A gateway config with `worker` (named as it is) and the test CA as `[upstream.tls] ca_file`;
/// probes every 200 ms, so a failing worker is taken out by its third (or at once, by passive
/// marking, when a request's handshake fails), well after a test's first request.
fn config_for(pki: &Pki, worker: &WorkerHandle) -> Config {
    let mut config = test_config(&[]);
    config.health.interval = Duration::from_millis(200);
    config.upstream.tls.ca_file = pki.ca_file.clone();
    config.workers.push(WorkerConfig {
        name: Some(worker.name().to_owned()),
        ..WorkerConfig::from_url(&worker.url())
    });
    config
}

async fn chat(gateway: &RunningGateway) -> (u16, Value) {
    let response = client()
        .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
        .json(&json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn metrics(gateway: &RunningGateway) -> String {
    client()
        .get(format!("http://{}/metrics", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Polls (bounded) until the `/metrics` series `series` is at least `at_least`.
async fn wait_metric(gateway: &RunningGateway, series: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(gateway).await;
        if sample(&text, series).is_some_and(|v| v >= at_least) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never reached {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every worker back at 0 requests in flight.
async fn assert_idle(gateway: &RunningGateway) {
    let loads = wait_all_idle(gateway).await;
    assert!(loads.iter().all(|(_, n)| *n == 0), "{loads:?}");
}

fn probe_series(worker: &str, reason: &str) -> String {
    format!("bch_probe_failures_total{{worker=\"{worker}\",reason=\"{reason}\"}}")
}

/// A request to `worker` that cannot be completed is answered 502 with `words` in its message;
/// the probes count `tls` failures and the worker goes unhealthy.
async fn assert_refused_over_tls(gateway: &RunningGateway, worker: &str, words: &str) {
    let (status, body) = chat(gateway).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "worker_unreachable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(words), "{message}");
    wait_metric(gateway, &probe_series(worker, "tls"), 1.0).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let record = loop {
        let record = worker_record(gateway, worker).await.unwrap();
        if record["healthy"] == false {
            break record;
        }
        assert!(Instant::now() < deadline, "never unhealthy: {record}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The probe's reason, in the record `/admin/workers` and the console show.
    let reason = record["probe_failure"].as_str().unwrap_or_default();
    assert!(reason.starts_with("tls: "), "{record}");
    assert_idle(gateway).await;
}

#[tokio::test]
async fn an_https_worker_is_served_and_probed_with_the_configured_ca() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "tls-0", &pki.server, false).await;
    let gateway = start(config_for(&pki, &worker)).await;
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    assert_eq!(worker.stats().requests_total, 1);
    // The start-up probe went over TLS too, and passed.
    wait_metric(&gateway, &probe_series("tls-0", "refused"), 0.0).await;
    let text = metrics(&gateway).await;
    for reason in ["tls", "refused", "error"] {
        assert_eq!(sample(&text, &probe_series("tls-0", reason)), Some(0.0));
    }
    assert_eq!(
        worker_record(&gateway, "tls-0").await.unwrap()["healthy"],
        true
    );
    assert_idle(&gateway).await;
}

#[tokio::test]
async fn a_worker_requiring_client_certificates_serves_ours_and_refuses_without() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "mtls-0", &pki.server, true).await;

    let mut with_certificate = config_for(&pki, &worker);
    with_certificate.upstream.tls.client_cert_file = pki.client.cert.clone();
    with_certificate.upstream.tls.client_key_file = pki.client.key.clone();
    let gateway = start(with_certificate).await;
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert_idle(&gateway).await;
    gateway.shutdown().await;

    let gateway = start(config_for(&pki, &worker)).await;
    assert_refused_over_tls(&gateway, "mtls-0", "tls: the worker refused the handshake").await;
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_not_trusted() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "rogue-0", &pki.rogue, false).await;
    let gateway = start(config_for(&pki, &worker)).await;
    let words = "tls: certificate not trusted (UnknownIssuer)";
    assert_refused_over_tls(&gateway, "rogue-0", words).await;
    assert_eq!(worker.stats().requests_total, 0);
}

#[tokio::test]
async fn an_expired_certificate_is_refused_as_expired() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "expired-0", &pki.expired, false).await;
    let gateway = start(config_for(&pki, &worker)).await;
    assert_refused_over_tls(&gateway, "expired-0", "tls: certificate expired").await;
}

#[tokio::test]
async fn a_worker_addressed_by_ip_is_checked_against_its_server_name() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "gpu-0", &pki.named, false).await;
    let mut config = config_for(&pki, &worker);
    config.workers[0].server_name = Some("gpu-0.test".into());
    let gateway = start(config).await;
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert_idle(&gateway).await;
    gateway.shutdown().await;

    // Without it the certificate is checked against 127.0.0.1, which it does not name.
    let gateway = start(config_for(&pki, &worker)).await;
    let words = "tls: certificate not valid for the worker's name";
    assert_refused_over_tls(&gateway, "gpu-0", words).await;
}

#[tokio::test]
async fn the_scraper_reads_an_https_workers_metrics() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "scraped-0", &pki.server, true).await;
    let mut config = config_for(&pki, &worker);
    config.upstream.tls.client_cert_file = pki.client.cert.clone();
    config.upstream.tls.client_key_file = pki.client.key.clone();
    config.load.source = LoadSource::WorkerMetrics;
    // Room for a handshake of a debug build on a busy machine: the scrape's deadline is 400 ms.
    config.load.scrape_interval = Duration::from_millis(500);
    config.load.stale_after = Duration::from_millis(2_000);
    let gateway = start(config).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let record = worker_record(&gateway, "scraped-0").await.unwrap();
        if record["reported_load"] == 0 && record["load_stale"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "never scraped: {record}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = metrics(&gateway).await;
    // No scrape failed for a reason of TLS or the connection (a slow one may have timed out).
    let failures: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("bch_load_scrape_failures_total{") && !l.ends_with(" 0"))
        .filter(|l| !l.contains("reason=\"timeout\""))
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert_idle(&gateway).await;
    drop(pki);
}

#[tokio::test]
async fn discovered_https_workers_are_checked_against_their_srv_target() {
    let pki = Pki::new();
    let identity = pki
        .files
        .issue_by("w0", pki.files.ca(), &["w0.llm.test"], server_auth);
    let worker = https_worker(&pki, "w0", &identity, false).await;
    let srv = "_https._tcp.llm.test";
    let zone = Zone::default().srv(
        srv,
        "w0.llm.test",
        worker.local_addr().port(),
        Some(worker.local_addr().ip()),
    );
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let mut config = test_config(&[]);
    config.upstream.tls.ca_file = pki.ca_file.clone();
    config.discovery = vec![DiscoveryConfig {
        resolver: Some(dns.address()),
        interval: Duration::from_millis(200),
        scheme: "https".into(),
        ..DiscoveryConfig::new(srv)
    }];
    let gateway = start(config).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker_record(&gateway, "w0.llm.test").await.is_none() {
        assert!(Instant::now() < deadline, "never discovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let record = worker_record(&gateway, "w0.llm.test").await.unwrap();
    assert_eq!(record["url"], worker.url(), "{record}");
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert_idle(&gateway).await;
}

/// `POST /admin/reload` reads `[upstream.tls]` again: a file that cannot be used is refused (the
/// trust in force stays), and a new CA file is in force for the next connection.
#[tokio::test]
async fn a_reload_puts_a_new_ca_in_force_and_refuses_an_unreadable_one() {
    let pki = Pki::new();
    let worker = https_worker(&pki, "reloaded-0", &pki.server, false).await;
    let other_ca = pki
        .files
        .write("other-ca.crt", &Authority::new("another CA").pem());
    let mut config = config_for(&pki, &worker);
    config.upstream.tls.ca_file = other_ca;
    let file = pki.files.path("gatewayd.toml");
    let write = |config: &Config| {
        std::fs::write(
            &file,
            gatewayd::config::persist::to_toml(config, &[]).unwrap(),
        )
        .unwrap();
    };
    write(&config);
    let options = gatewayd::StartOptions::new(config.clone()).config_file(file.clone());
    let gateway = gatewayd::start(options).await.unwrap();
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 502, "trusting another CA: {body}");
    let reload = || {
        client()
            .post(format!("http://{}/admin/reload", gateway.control_addr))
            .send()
    };

    config.upstream.tls.ca_file = pki.files.path("absent-ca.crt");
    write(&config);
    let refused = reload().await.unwrap();
    assert_eq!(refused.status(), 400);
    let answer: Value = refused.json().await.unwrap();
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("upstream.tls") && message.contains("absent-ca.crt"),
        "{message}"
    );

    config.upstream.tls.ca_file = pki.ca_file.clone();
    write(&config);
    assert_eq!(reload().await.unwrap().status(), 200);
    // The probes now pass and bring the worker back; then requests reach it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker_record(&gateway, "reloaded-0").await.unwrap()["healthy"] != true {
        assert!(Instant::now() < deadline, "never healthy after the reload");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert_idle(&gateway).await;
}

#[tokio::test]
async fn unusable_upstream_tls_files_refuse_the_start_naming_the_file() {
    let pki = Pki::new();
    let mut config = test_config(&[]);
    config.upstream.tls.ca_file = pki.files.path("absent-ca.crt");
    let error = gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .err()
        .expect("an unreadable CA file refuses the start")
        .to_string();
    assert!(
        error.contains("upstream.tls") && error.contains("absent-ca.crt"),
        "{error}"
    );

    let mut config = test_config(&[]);
    config.upstream.tls.client_cert_file = pki.client.cert.clone();
    config.upstream.tls.client_key_file = pki.server.key.clone();
    let error = gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .err()
        .expect("a key of another certificate refuses the start")
        .to_string();
    assert!(
        error.contains("client_cert_file and client_key_file"),
        "{error}"
    );

    // An expired client certificate still starts (workers that do not ask never see it), with a
    // warning from the start-up checks and check-config.
    let expired_client = pki
        .files
        .issue_by("old-client", pki.files.ca(), &[], |params| {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        });
    let mut config = test_config(&[]);
    config.upstream.tls.client_cert_file = expired_client.cert.clone();
    config.upstream.tls.client_key_file = expired_client.key.clone();
    let findings = gatewayd::check(&gatewayd::StartOptions::new(config));
    assert!(findings.errors.is_empty(), "{findings:?}");
    let warned = findings
        .warnings
        .iter()
        .any(|w| w.starts_with("upstream.tls: client certificate") && w.contains("expired"));
    assert!(warned, "{findings:?}");
}
