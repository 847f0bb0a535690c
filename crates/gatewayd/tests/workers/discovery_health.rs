//! Discovery's health against a real DNS server (dnsmasq): an A/AAAA source stands on the family
//! that answered when the other is refused, and each source's state (`ok`, `failing`, `empty`) is
//! in `GET /admin/discovery` and in the telemetry snapshot.

use crate::common;
use crate::discovery::{admin_list, discovery_errors, metric, wait_admin_list};
use crate::dnsmasq;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use bch_core::telemetry::{DiscoverySource, DiscoveryState, ServerMessage};
use common::ws::Client;
use dnsmasq::{Dnsmasq, Zone};
use gatewayd::RunningGateway;
use gatewayd::config::{Config, DiscoveryConfig};
use serde_json::Value;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A source resolved at `resolver`, re-resolved every 200 ms.
fn source(resolver: SocketAddr, name: &str, port: Option<u16>) -> DiscoveryConfig {
    DiscoveryConfig {
        resolver: Some(resolver),
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(500),
        port,
        ..DiscoveryConfig::new(name)
    }
}

fn config_with(sources: Vec<DiscoveryConfig>) -> Config {
    let mut config = common::test_config(&[]);
    config.discovery = sources;
    config
}

async fn discovery(gateway: &RunningGateway) -> Vec<Value> {
    admin_list(gateway, "/admin/discovery", "sources").await
}

/// Polls `GET /admin/discovery` (bounded) until `done` holds; answers that list.
async fn wait_discovery(
    gateway: &RunningGateway,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    wait_admin_list(gateway, ("/admin/discovery", "sources"), what, done).await
}

/// A loopback UDP port nobody listens on: queries to it are refused at once.
fn dead_resolver() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

/// dnsmasq without upstream servers answers an A query for a name of its hosts file outside its
/// local domains, and refuses the AAAA query (it would forward it, and has nowhere to): the A
/// answer is the fleet.
#[tokio::test]
async fn an_address_source_uses_the_a_answer_when_aaaa_is_refused() {
    const NAME: &str = "llm.example";
    let zone = Zone::addresses(vec![
        (IpAddr::from([127, 0, 0, 2]), NAME.to_owned()),
        (IpAddr::from([127, 0, 0, 3]), NAME.to_owned()),
    ]);
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let gateway = common::start(config_with(vec![source(dns.address(), NAME, Some(8000))])).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let urls: Vec<String> = common::worker_records(&gateway)
            .await
            .iter()
            .map(|w| w["url"].as_str().unwrap().to_owned())
            .collect();
        if urls.len() == 2 {
            assert_eq!(urls, ["http://127.0.0.2:8000", "http://127.0.0.3:8000"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the A answer never became the fleet (AAAA refused): {urls:?}; /admin/discovery: {:#?}",
            discovery(&gateway).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused =
        format!("bch_discovery_lookup_errors_total{{source=\"dns:{NAME}\",record_type=\"AAAA\"}}");
    assert!(metric(&gateway, &refused) >= 1.0, "{refused} counts");
    let a_errors =
        format!("bch_discovery_lookup_errors_total{{source=\"dns:{NAME}\",record_type=\"A\"}}");
    assert!(
        gateway.metrics_text().contains(&format!("{a_errors} 0")),
        "the A series exists at 0"
    );
    assert_eq!(
        discovery_errors(&gateway, NAME),
        0.0,
        "a refused family is not a failed resolution"
    );
    let sources = discovery(&gateway).await;
    assert_eq!(sources[0]["state"], "ok", "{sources:#?}");
    let error = sources[0]["last_error"].as_str().unwrap();
    assert!(
        error.contains("AAAA") && error.contains("Refused"),
        "the refusal is the last error: {error}"
    );
}

#[tokio::test]
async fn admin_discovery_and_telemetry_report_each_sources_state() {
    const SRV: &str = "_http._tcp.llm.test";
    let zone = Zone::default()
        .srv(SRV, "w0.llm.test", 8000, Some(LOOPBACK))
        .srv(SRV, "w1.llm.test", 8001, Some(LOOPBACK));
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let gateway = common::start(config_with(vec![
        source(dns.address(), SRV, None),
        source(dns.address(), "gone.llm.test", Some(8000)),
        source(dead_resolver(), "down.llm.test", Some(8000)),
    ]))
    .await;
    let sources = wait_discovery(&gateway, "every source resolved", |s| {
        s.len() == 3 && s.iter().all(|s| s["state"] != "pending")
    })
    .await;
    let row = |i: usize, key: &str| sources[i][key].clone();
    assert_eq!(
        (
            row(0, "name"),
            row(0, "source"),
            row(0, "kind"),
            row(0, "state")
        ),
        (
            SRV.into(),
            format!("dns:{SRV}").into(),
            "srv".into(),
            "ok".into()
        )
    );
    assert_eq!(row(0, "workers"), 2);
    assert!(
        row(0, "last_good_age_ms").as_u64().unwrap() < 10_000,
        "{sources:#?}"
    );
    assert_eq!(row(0, "last_error"), Value::Null);
    assert_eq!(
        (row(1, "kind"), row(1, "state"), row(1, "workers")),
        ("address".into(), "empty".into(), 0.into())
    );
    assert_eq!(row(1, "last_error"), "NXDOMAIN");
    assert_eq!(row(1, "last_good_age_ms"), Value::Null, "never answered");
    assert_eq!(row(2, "state"), "failing", "{sources:#?}");
    assert!(row(2, "last_error").as_str().is_some_and(|e| !e.is_empty()));
    assert!(row(2, "last_error_ms").as_u64().is_some());

    let mut client = Client::connect(&gateway).await;
    let snapshot = client
        .until(|m| match m {
            ServerMessage::Snapshot(s) => Some(s.clone()),
            _ => None,
        })
        .await;
    let states: Vec<(&str, DiscoveryState, u64)> = snapshot
        .discovery
        .iter()
        .map(|s| (s.name.as_str(), s.state.get().unwrap(), s.workers))
        .collect();
    assert_eq!(
        states,
        [
            (SRV, DiscoveryState::Ok, 2),
            ("gone.llm.test", DiscoveryState::Empty, 0),
            ("down.llm.test", DiscoveryState::Failing, 0),
        ]
    );
    // Each good refresh moves `last_good_ms`, so a tick brings the list again.
    let again: Vec<DiscoverySource> = client
        .until(|m| match m {
            ServerMessage::Tick(t) => t.discovery.clone(),
            _ => None,
        })
        .await;
    assert_eq!(again.len(), 3);
    assert!(again[0].last_good_ms >= snapshot.discovery[0].last_good_ms);
}

/// A reload that points a source at another resolver restarts its task. The old task, still
/// waiting on the old resolver, gives up later: its failure is counted, but it is not the source's
/// state, which the new task's answer set.
#[tokio::test]
async fn a_restarted_sources_old_task_does_not_report_its_late_failure_as_the_state() {
    const NAME: &str = "one.llm.test";
    let zone = Zone::addresses(vec![(IpAddr::from([127, 0, 0, 2]), NAME.to_owned())]);
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut entry = source(silent.local_addr().unwrap(), NAME, Some(8000));
    entry.timeout = Duration::from_millis(1500);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gatewayd.toml");
    let mut config = config_with(vec![entry]);
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    let gateway =
        gatewayd::start(gatewayd::StartOptions::new(config.clone()).config_file(file.clone()))
            .await
            .unwrap();
    // The old task's first query reached the silent resolver: it waits for an answer.
    let mut datagram = [0u8; 512];
    tokio::time::timeout(Duration::from_secs(10), silent.recv_from(&mut datagram))
        .await
        .expect("a query")
        .unwrap();
    config.discovery[0].resolver = Some(dns.address());
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    let reload = common::client()
        .post(format!("http://{}/admin/reload", gateway.control_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);
    wait_discovery(&gateway, "the new task's answer", |s| s[0]["state"] == "ok").await;
    // A resolver that never answers: a timeout.
    let errors = format!("bch_discovery_errors_total{{source=\"dns:{NAME}\",reason=\"timeout\"}}");
    let refreshes = format!("bch_discovery_refreshes_total{{source=\"dns:{NAME}\"}}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while metric(&gateway, &errors) < 1.0 {
        assert!(Instant::now() < deadline, "the old task never gave up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two more resolutions (the new task's) after the old one failed.
    let seen = metric(&gateway, &refreshes);
    while metric(&gateway, &refreshes) < seen + 2.0 {
        assert!(Instant::now() < deadline, "no more refreshes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sources = discovery(&gateway).await;
    assert_eq!(sources[0]["state"], "ok", "{sources:#?}");
    assert_eq!(
        sources[0]["last_error"],
        Value::Null,
        "the old entry's failure is not this source's error: {sources:#?}"
    );
    gateway.shutdown().await;
}
