//! DNS discovery against a real DNS server (dnsmasq on a free loopback port) and real workers
//! (bch-drill simulated workers; the harness's fakes where a stream must be held open mid-body):
//! SRV and A/AAAA names, members joining and leaving, a member leaving while it holds streams,
//! empty answers, a thousand records, two replicas building one ring, the 409 for deleting a
//! discovered worker, refreshes that change nothing, reloads. Outages and bad records, which are
//! about what gatewayd logs, are in `daemon/discovery.rs`.

use crate::common;
use crate::dnsmasq;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_worker};
use dnsmasq::{Dnsmasq, Zone};
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, DiscoveryConfig, WorkerConfig};
use serde_json::{Value, json};

const SRV: &str = "_http._tcp.llm.test";
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A source resolved at `dns`, re-resolved every 200 ms.
fn source(dns: &Dnsmasq, name: &str) -> DiscoveryConfig {
    DiscoveryConfig {
        resolver: Some(dns.address()),
        interval: Duration::from_millis(200),
        ..DiscoveryConfig::new(name)
    }
}

fn config_with(sources: Vec<DiscoveryConfig>) -> Config {
    let mut config = common::test_config(&[]);
    config.discovery = sources;
    config
}

async fn sim_worker(addr: SocketAddr, name: &str) -> WorkerHandle {
    spawn_worker(addr, name, SimConfig::default().with_time_scale(0.0))
        .await
        .unwrap()
}

/// `n` simulated workers on 127.0.0.1 and an SRV zone naming them `w0.llm.test`, ….
async fn srv_fleet(n: usize) -> (Vec<WorkerHandle>, Zone) {
    let mut workers = Vec::new();
    let mut zone = Zone::default();
    for i in 0..n {
        let worker = sim_worker(SocketAddr::new(LOOPBACK, 0), &format!("sim-{i}")).await;
        let target = format!("w{i}.llm.test");
        zone = zone.srv(SRV, &target, worker.local_addr().port(), Some(LOOPBACK));
        workers.push(worker);
    }
    (workers, zone)
}

async fn get_json(gateway: &RunningGateway, path: &str) -> Value {
    bch_drill::tls::get(format!("http://{}{path}", gateway.control_addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The list under `key` in the control plane's answer to `GET path` (`/admin/workers` →
/// `workers`, `/admin/discovery` → `sources`).
pub(super) async fn admin_list(gateway: &RunningGateway, path: &str, key: &str) -> Vec<Value> {
    get_json(gateway, path).await[key]
        .as_array()
        .unwrap_or_else(|| panic!("{path} has no list {key}"))
        .clone()
}

/// Polls [`admin_list`] (bounded) until `done` holds; answers that list.
pub(super) async fn wait_admin_list(
    gateway: &RunningGateway,
    (path, key): (&str, &str),
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = admin_list(gateway, path, key).await;
        if done(&listed) {
            return listed;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {listed:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn workers(gateway: &RunningGateway) -> Vec<Value> {
    admin_list(gateway, "/admin/workers", "workers").await
}

fn field<'a>(workers: &'a [Value], key: &str) -> BTreeSet<&'a str> {
    workers.iter().map(|w| w[key].as_str().unwrap()).collect()
}

/// Polls `/admin/workers` (bounded) until `done` holds; answers that list.
async fn wait_workers(
    gateway: &RunningGateway,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    wait_admin_list(gateway, ("/admin/workers", "workers"), what, done).await
}

/// The value of the metric line starting with `prefix` (0 when absent).
pub(super) fn metric(gateway: &RunningGateway, prefix: &str) -> f64 {
    gateway
        .metrics_text()
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Failed resolutions of `name`, whatever their reason.
pub(super) fn discovery_errors(gateway: &RunningGateway, name: &str) -> f64 {
    ["timeout", "truncated", "error"]
        .iter()
        .map(|reason| {
            metric(
                gateway,
                &format!("bch_discovery_errors_total{{source=\"dns:{name}\",reason=\"{reason}\"}}"),
            )
        })
        .sum()
}

fn refreshes(gateway: &RunningGateway, name: &str) -> f64 {
    metric(
        gateway,
        &format!("bch_discovery_refreshes_total{{source=\"dns:{name}\"}}"),
    )
}

/// Polls (bounded) until `name`'s refresh count reaches `count`.
async fn wait_refreshes(gateway: &RunningGateway, name: &str, count: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while refreshes(gateway, name) < count {
        assert!(
            Instant::now() < deadline,
            "fewer than {count} refreshes of {name}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn chat(gateway: &RunningGateway, header: (&str, &str)) -> reqwest::Response {
    common::client()
        .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
        .header(header.0, header.1)
        .json(&json!({"messages":[{"role":"user","content":"hello"}],"max_tokens":2}))
        .send()
        .await
        .unwrap()
}

/// `x-bch-worker` of a 200 answer to a request keyed `key`.
async fn served_by(gateway: &RunningGateway, key: &str) -> String {
    let response = chat(gateway, ("x-smg-routing-key", key)).await;
    assert_eq!(response.status(), 200);
    let worker = response.headers()["x-bch-worker"]
        .to_str()
        .unwrap()
        .to_owned();
    response.bytes().await.unwrap();
    worker
}

/// What the offline `gatewayd explain --batch` places each key on, for workers at `urls`.
fn explain_offline(urls: &[&str], keys: &[String]) -> Vec<String> {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gatewayd"))
        .args(["explain", "--batch"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines: String = keys
        .iter()
        .map(|key| {
            let scenario = json!({"workers": urls, "routing_key": key, "explicit": true,
                "policy": "consistent_hashing"});
            format!("{scenario}\n")
        })
        .collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["worker"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn srv_discovery_finds_three_workers_and_keys_land_where_explain_says() {
    let (sims, zone) = srv_fleet(3).await;
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let gateway = common::start(config_with(vec![source(&dns, SRV)])).await;
    let listed = wait_workers(&gateway, "three workers", |w| w.len() == 3).await;
    assert_eq!(
        field(&listed, "name"),
        BTreeSet::from(["w0.llm.test", "w1.llm.test", "w2.llm.test"]),
        "SRV targets are the names"
    );
    let urls: Vec<String> = sims.iter().map(WorkerHandle::url).collect();
    assert_eq!(
        field(&listed, "url"),
        urls.iter().map(String::as_str).collect()
    );
    assert!(listed.iter().all(|w| w["source"] == format!("dns:{SRV}")));
    // The URL is the ring identity: the offline explain over those URLs places every key.
    let keys: Vec<String> = (0..40).map(|i| format!("session-{i}")).collect();
    let url_of = |name: &str| {
        listed.iter().find(|w| w["name"] == name).unwrap()["url"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let predicted = explain_offline(&urls.iter().map(String::as_str).collect::<Vec<_>>(), &keys);
    let mut used = BTreeSet::new();
    for (key, expected) in keys.iter().zip(&predicted) {
        let worker = served_by(&gateway, key).await;
        assert_eq!(&url_of(&worker), expected, "{key}");
        used.insert(worker);
    }
    assert_eq!(used.len(), 3, "forty keys spread over every worker");
    let served: u64 = sims.iter().map(|w| w.stats().requests_total).sum();
    assert_eq!(served, 40);
    let gauge = format!("bch_discovery_workers{{source=\"dns:{SRV}\"}}");
    assert_eq!(metric(&gateway, &gauge), 3.0);
    assert_eq!(
        metric(&gateway, "bch_discovery_workers{source=\"static\"}"),
        0.0
    );
    gateway.shutdown().await;
}

/// Fake workers listening on one port of each of `hosts` (127.0.0.2, …), for A records.
async fn fakes_on(hosts: &[&str]) -> (u16, Vec<common::FakeWorker>) {
    'port: loop {
        let first = tokio::net::TcpListener::bind((ip(hosts[0]), 0))
            .await
            .unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for host in &hosts[1..] {
            match tokio::net::TcpListener::bind((ip(host), port)).await {
                Ok(listener) => listeners.push(listener),
                Err(_) => continue 'port,
            }
        }
        let mut fakes = Vec::new();
        for (host, listener) in hosts.iter().zip(listeners) {
            fakes.push(common::fake_worker_on(listener, &format!("fake-{host}")).await);
        }
        return (port, fakes);
    }
}

fn hosts_of(name: &str, addresses: &[&str]) -> Vec<(IpAddr, String)> {
    addresses.iter().map(|a| (ip(a), name.to_owned())).collect()
}

#[tokio::test]
async fn a_new_member_serves_within_one_interval_and_a_leaving_one_finishes_its_streams() {
    let all = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let (port, fakes) = fakes_on(&all).await;
    let name = "llm.test";
    let zone = Zone::addresses(hosts_of(name, &all[..2]));
    let Some(mut dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let config = config_with(vec![DiscoveryConfig {
        port: Some(port),
        interval: Duration::from_millis(300),
        ..source(&dns, name)
    }]);
    let gateway = common::start(config).await;
    wait_workers(&gateway, "two A-record workers", |w| w.len() == 2).await;

    // Joining: the first refresh that starts after the DNS change applies it.
    let before = refreshes(&gateway, name);
    dns.set_addresses(&hosts_of(name, &all));
    let joined = format!("127.0.0.4:{port}");
    wait_workers(&gateway, "the third worker", |w| {
        field(w, "name").contains(joined.as_str())
    })
    .await;
    assert!(
        refreshes(&gateway, name) <= before + 2.0,
        "applied by the refresh in flight or the next one, not later"
    );
    let response = common::client()
        .get(format!("http://{}/echo", gateway.data_addr))
        .header("x-smg-target-worker", &joined)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-worker-name"], "fake-127.0.0.4");

    // Leaving while holding three streams.
    let leaving = format!("127.0.0.3:{port}");
    let mut keys = Vec::new();
    for i in 0..200 {
        let key = format!("k{i}");
        if common::preferred_worker(&gateway, &key).await == leaving {
            keys.push(key);
        }
    }
    assert!(
        keys.len() >= 10,
        "a third of 200 keys prefer each worker: {}",
        keys.len()
    );
    let mut held = Vec::new();
    for _ in 0..3 {
        let response = common::client()
            .get(format!("http://{}/hold", gateway.data_addr))
            .header("x-smg-target-worker", &leaving)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let first = body.next().await.unwrap().unwrap();
        assert!(first.starts_with(b"data: {\"first\""));
        held.push(body);
    }
    let record = |listed: &[Value], name: &str| listed.iter().find(|w| w["name"] == name).cloned();
    let listed = workers(&gateway).await;
    let before_leaving = record(&listed, &leaving).unwrap();
    assert_eq!(before_leaving["active"], 3);
    dns.set_addresses(&hosts_of(name, &[all[0], all[2]]));
    wait_workers(&gateway, "the leaver gone", |w| {
        !field(w, "name").contains(leaving.as_str())
    })
    .await;
    let reached = fakes[1]
        .state
        .requests
        .load(std::sync::atomic::Ordering::SeqCst);
    for key in &keys {
        assert_ne!(served_by_echo(&gateway, key).await, leaving);
    }
    assert_eq!(
        fakes[1]
            .state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        reached,
        "no new request reached the worker that left"
    );
    fakes[1].release_all();
    for body in held {
        let rest: Vec<_> = body.map(|chunk| chunk.unwrap()).collect().await;
        let text: Vec<u8> = rest.concat();
        assert!(
            String::from_utf8_lossy(&text).contains("[DONE]"),
            "the held stream completed"
        );
    }

    // Back: the same ring position and counters that were never reset, at rest.
    dns.set_addresses(&hosts_of(name, &all));
    let listed = wait_workers(&gateway, "the leaver back", |w| {
        record(w, &leaving).is_some_and(|r| r["active"] == 0)
    })
    .await;
    let back = record(&listed, &leaving).unwrap();
    assert_eq!(back["requests_total"], before_leaving["requests_total"]);
    assert!(back["requests_total"].as_u64().unwrap() >= 3);
    for key in &keys {
        assert_eq!(common::preferred_worker(&gateway, key).await, leaving);
    }
    gateway.shutdown().await;
}

/// `x-bch-worker` of a keyed `GET /echo` (the fakes speak no chat API).
async fn served_by_echo(gateway: &RunningGateway, key: &str) -> String {
    let response = common::client()
        .get(format!("http://{}/echo", gateway.data_addr))
        .header("x-smg-routing-key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.headers()["x-bch-worker"]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn an_empty_answer_keeps_the_fleet_until_empty_after_ms_then_the_503_says_why() {
    let (_sims, zone) = srv_fleet(2).await;
    let Some(mut dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let empty_after = Duration::from_millis(3_000);
    let gateway = common::start(config_with(vec![DiscoveryConfig {
        empty_after,
        ..source(&dns, SRV)
    }]))
    .await;
    wait_workers(&gateway, "two workers", |w| w.len() == 2).await;
    let errors_before = discovery_errors(&gateway, SRV);
    let emptied_at = Instant::now();
    dns.restart(&Zone::default());
    // Two NXDOMAIN answers later the fleet is still there, and serves.
    let seen = refreshes(&gateway, SRV);
    wait_refreshes(&gateway, SRV, seen + 2.0).await;
    let early = emptied_at.elapsed();
    if early < empty_after {
        assert_eq!(workers(&gateway).await.len(), 2, "kept for empty_after_ms");
        served_by(&gateway, "session-1").await;
    }
    assert_eq!(
        discovery_errors(&gateway, SRV),
        errors_before,
        "NXDOMAIN is an answer, not an error"
    );
    wait_workers(&gateway, "the source emptied", <[Value]>::is_empty).await;
    assert!(
        emptied_at.elapsed() >= empty_after,
        "not before empty_after_ms"
    );
    let response = chat(&gateway, ("x-smg-routing-key", "session-1")).await;
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_healthy_workers");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no worker is registered"), "{message}");
    assert!(
        message.contains("DNS discovery has found none"),
        "{message}"
    );
    // Records back: the fleet is back.
    dns.restart(&zone);
    wait_workers(&gateway, "the workers back", |w| w.len() == 2).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_thousand_records_in_one_answer_work_for_a_and_srv() {
    let port = 8000;
    let addresses: Vec<(IpAddr, String)> = (0..1000)
        .map(|i| {
            (
                IpAddr::from([127, 1, (i / 250) as u8, (i % 250 + 1) as u8]),
                "big.llm.test".to_owned(),
            )
        })
        .collect();
    // One target for all thousand SRV records keeps dnsmasq's answer within the 16 KiB that DNS
    // name compression can point into (docs/discovery.md).
    let mut zone = Zone::addresses(addresses);
    for i in 0..1000 {
        zone = zone.srv(
            "_big._tcp.llm.test",
            "many.llm.test",
            20_000 + i,
            Some(ip("127.2.0.1")),
        );
    }
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let mut config = config_with(vec![
        DiscoveryConfig {
            port: Some(port),
            ..source(&dns, "big.llm.test")
        },
        source(&dns, "_big._tcp.llm.test"),
    ]);
    // Nothing listens there: one probe round, not ten a second.
    config.health.interval = Duration::from_millis(60_000);
    let gateway = common::start(config).await;
    let listed = wait_workers(&gateway, "two thousand workers", |w| w.len() == 2000).await;
    let names = field(&listed, "name");
    assert_eq!(names.len(), 2000, "names are unique");
    assert!(names.contains("127.1.3.250:8000"));
    assert!(
        names.contains("127.2.0.1:20999"),
        "a target standing for many workers: IP:PORT"
    );
    let a_source = listed
        .iter()
        .filter(|w| w["source"] == "dns:big.llm.test")
        .count();
    assert_eq!(a_source, 1000);
    assert_eq!(gateway.routing_table().ring().len(), 2000 * 150);
    gateway.shutdown().await;
}

#[tokio::test]
async fn two_replicas_discovering_one_name_build_identical_rings() {
    let name = "fleet.llm.test";
    let zone = Zone::addresses(
        (1..=12)
            .map(|i| (IpAddr::from([127, 3, 0, i]), name.to_owned()))
            .collect(),
    );
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let mut config = config_with(vec![DiscoveryConfig {
        port: Some(8000),
        ..source(&dns, name)
    }]);
    config.health.interval = Duration::from_millis(60_000);
    let (a, b) = (
        common::start(config.clone()).await,
        common::start(config).await,
    );
    let first = wait_workers(&a, "12 workers on a", |w| w.len() == 12).await;
    let second = wait_workers(&b, "12 workers on b", |w| w.len() == 12).await;
    let order = |w: &[Value]| w.iter().map(|w| w["url"].clone()).collect::<Vec<_>>();
    assert_eq!(
        order(&first),
        order(&second),
        "the same order, whatever order DNS answered in"
    );
    let mut preferred = BTreeSet::new();
    for i in 0..200 {
        let path = format!("/admin/explain?routing_key=user-{i}");
        let (x, y) = (get_json(&a, &path).await, get_json(&b, &path).await);
        assert_eq!(x, y, "{path}");
        preferred.insert(x["preferred"].as_str().unwrap().to_owned());
    }
    assert!(
        preferred.len() >= 10,
        "200 keys over 12 workers: {preferred:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_discovered_worker_cannot_be_deleted_and_a_static_one_with_its_url_is_the_same_worker() {
    let (sims, zone) = srv_fleet(2).await;
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let mut config = config_with(vec![source(&dns, SRV)]);
    config.workers.push(WorkerConfig {
        name: Some("pinned".into()),
        ..WorkerConfig::from_url(&sims[0].url())
    });
    let gateway = common::start(config).await;
    let listed = wait_workers(&gateway, "w1 discovered", |w| {
        w.len() == 2 && field(w, "name").contains("w1.llm.test")
    })
    .await;
    let pinned = listed.iter().find(|w| w["name"] == "pinned").unwrap();
    assert_eq!(
        pinned["source"], "static",
        "one worker per URL; the configured entry wins"
    );
    let client = common::client();
    let control = format!("http://{}", gateway.control_addr);
    for name in ["w1.llm.test", "pinned"] {
        let response = client
            .delete(format!("{control}/admin/workers/{name}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 409, "{name}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "worker_discovered");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("dns:{SRV}")) && message.contains("come back"),
            "{message}"
        );
    }
    // A discovered worker drains, but a drain that would remove it is refused as DELETE is.
    for (body, status) in [(r#"{"remove":true}"#, 409), (r#"{"remove":false}"#, 200)] {
        let response = client
            .post(format!("{control}/admin/workers/w1.llm.test/drain"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{body}");
        let answer: Value = response.json().await.unwrap();
        if status == 409 {
            assert_eq!(answer["error"]["code"], "worker_discovered");
        } else {
            assert_eq!(answer["state"], "draining", "{answer}");
        }
    }
    let response = client
        .post(format!("{control}/admin/workers"))
        .json(&json!({"url": sims[1].url(), "name": "static-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let listed = workers(&gateway).await;
    assert_eq!(
        field(&listed, "name"),
        BTreeSet::from(["pinned", "static-1"])
    );
    assert!(listed.iter().all(|w| w["source"] == "static"));
    assert_eq!(
        metric(&gateway, "bch_discovery_workers{source=\"static\"}"),
        2.0
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn refreshes_that_change_nothing_rebuild_nothing_and_a_reload_drops_a_removed_source() {
    let (_sims, zone) = srv_fleet(2).await;
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gatewayd.toml");
    let mut config = config_with(vec![source(&dns, SRV)]);
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    let gateway =
        gatewayd::start(gatewayd::StartOptions::new(config.clone()).config_file(file.clone()))
            .await
            .unwrap();
    wait_workers(&gateway, "two workers", |w| w.len() == 2).await;
    let generation = gateway.routing_table().membership_generation();
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/ws", gateway.control_addr))
            .await
            .unwrap();
    let snapshot = next_frame(&mut socket).await;
    assert_eq!(snapshot["type"], "snapshot");
    assert!(
        snapshot["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["source"] == format!("dns:{SRV}"))
    );
    // The join's own ring frame, if the aggregator had not ticked since, precedes the first tick.
    while next_frame(&mut socket).await["type"] != "tick" {}
    let frames = tokio::spawn(async move {
        let mut types = Vec::new();
        loop {
            let frame = next_frame(&mut socket).await;
            types.push(frame["type"].as_str().unwrap().to_owned());
            if frame["type"] == "ring" {
                return (types, frame);
            }
        }
    });
    let seen = refreshes(&gateway, SRV);
    wait_refreshes(&gateway, SRV, seen + 5.0).await;
    assert_eq!(
        gateway.routing_table().membership_generation(),
        generation,
        "no rebuild"
    );
    assert!(
        !frames.is_finished(),
        "no ring frame for five unchanged refreshes"
    );
    config.discovery.clear();
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    let reload = common::client()
        .post(format!("http://{}/admin/reload", gateway.control_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);
    assert!(
        workers(&gateway).await.is_empty(),
        "the removed source's workers left with it"
    );
    let (types, ring) = tokio::time::timeout(Duration::from_secs(10), frames)
        .await
        .unwrap()
        .unwrap();
    assert!(
        types.iter().all(|t| t == "tick" || t == "ring"),
        "{types:?}"
    );
    assert_eq!(ring["workers"], json!([]));
    // A removed source is no longer a source with no worker (which an alert fires on).
    let series = format!("bch_discovery_workers{{source=\"dns:{SRV}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway.metrics_text().contains(&series) {
        assert!(
            Instant::now() < deadline,
            "{series} is still exported for a removed source"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gateway.shutdown().await;
}

async fn next_frame<S>(socket: &mut S) -> Value
where
    S: futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a frame")
            .expect("open")
            .expect("no error");
        if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

/// An SRV target that is this gateway's own data-plane listener is skipped (requests to it would
/// loop) and counted in `bch_discovery_skipped_records` with the records the parser skipped.
#[tokio::test]
async fn a_target_that_is_the_gateways_own_listener_is_counted_as_skipped() {
    let (_sims, zone) = srv_fleet(1).await;
    let Some(mut dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let gateway = common::start(config_with(vec![source(&dns, SRV)])).await;
    wait_workers(&gateway, "the simulated worker", |w| w.len() == 1).await;
    let skipped = format!("bch_discovery_skipped_records{{source=\"dns:{SRV}\"}}");
    assert_eq!(metric(&gateway, &skipped), 0.0);
    let own = gateway.data_addr.port();
    dns.kill();
    dns.restart(&zone.srv(SRV, "self.llm.test", own, Some(LOOPBACK)));
    let deadline = Instant::now() + Duration::from_secs(15);
    while metric(&gateway, &skipped) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the gateway's own listener is not counted as skipped: {}",
            gateway.metrics_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&gateway, &skipped), 1.0);
    let listed = workers(&gateway).await;
    assert_eq!(field(&listed, "name"), BTreeSet::from(["w0.llm.test"]));
    gateway.shutdown().await;
}

/// An answer too large for one DNS message (5,000 A records, 5,000 SRV targets: truncated over
/// UDP, and more than TCP's 65,535 bytes) is reported as what it is, in `/admin/discovery` and as
/// the `truncated` reason of `bch_discovery_errors_total`, not as a resolver that did not answer.
#[tokio::test]
async fn an_answer_too_large_for_one_dns_message_is_reported_as_truncated() {
    let address =
        |block: u8, i: u32| IpAddr::from([127, block, (i / 250) as u8, (i % 250 + 1) as u8]);
    let mut zone = Zone::addresses(
        (0..5000)
            .map(|i| (address(1, i), "huge.llm.test".to_owned()))
            .collect(),
    );
    for i in 0..5000 {
        let target = format!("t{i}.llm.test");
        zone = zone.srv("_huge._tcp.llm.test", &target, 10_000, Some(address(3, i)));
    }
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let names = ["huge.llm.test", "_huge._tcp.llm.test"];
    let mut config = config_with(vec![
        DiscoveryConfig {
            port: Some(8000),
            ..source(&dns, names[0])
        },
        source(&dns, names[1]),
    ]);
    config.health.interval = Duration::from_millis(60_000);
    let gateway = common::start(config).await;
    let sources = wait_admin_list(
        &gateway,
        ("/admin/discovery", "sources"),
        "both sources failing",
        |s| s.iter().all(|s| s["state"] == "failing"),
    )
    .await;
    for source in &sources {
        let error = source["last_error"].as_str().unwrap();
        assert!(
            error.contains("truncated") && error.contains("too large for one DNS message"),
            "{source}"
        );
    }
    for name in names {
        let truncated =
            format!("bch_discovery_errors_total{{source=\"dns:{name}\",reason=\"truncated\"}}");
        assert!(
            metric(&gateway, &truncated) >= 1.0,
            "{}",
            gateway.metrics_text()
        );
    }
    assert_eq!(workers(&gateway).await.len(), 0);
    gateway.shutdown().await;
}
