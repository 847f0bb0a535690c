//! The load scraper's connections to a worker's `/metrics`, against a raw TCP server that counts
//! them: one kept-alive connection carries every scrape; a worker that closes its connections,
//! saying so or not, costs no failed scrape; and the scraper lets go of its connections when the
//! gateway stops, whether it was shut down or its runtime was simply dropped. And its targets:
//! workers found by DNS (a real dnsmasq) are scraped at their source's `metrics_path`.

use crate::common;
use crate::dnsmasq;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bch_core::fleet_load::LoadSource;
use dnsmasq::{Dnsmasq, Zone};
use gatewayd::RunningGateway;
use gatewayd::config::{Config, DiscoveryConfig, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the worker does with a connection after answering a scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterAnswer {
    /// Keeps it open for the next request.
    KeepAlive,
    /// Answers with `Connection: close` and closes it.
    SayCloseAndClose,
    /// Closes it without saying so, as a server whose keep-alive timer just fired does.
    CloseSilently,
    /// Never answers a scrape (health probes still are).
    HangScrapes,
    /// Answers scrapes 503 with a short body, keeping the connection.
    Unavailable,
    /// Answers scrapes with an SSH banner: a port that does not speak HTTP.
    NotHttp,
}

/// What the worker has seen on connections that carried a scrape (the health prober's are not
/// counted): how many, how many of them the gateway closed, scrapes answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    connections: u64,
    closed_by_gateway: u64,
    scrapes: u64,
}

const BODY: &str = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\nvllm:num_requests_waiting 1\n";

/// A worker speaking just enough HTTP/1.1 for scrapes and health probes, on `127.0.0.1:0`.
async fn counting_worker(after: AfterAnswer) -> (SocketAddr, watch::Receiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, watch) = watch::channel(Seen::default());
    let seen = Arc::new(seen);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut scraped_here = false;
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => {
                                if scraped_here {
                                    seen.send_modify(|s| s.closed_by_gateway += 1);
                                }
                                return;
                            }
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                    buffer.drain(..end + 4);
                    let scrape = head.starts_with("GET /metrics ");
                    if scrape && after == AfterAnswer::HangScrapes {
                        // Read on, so a gateway that gives up is seen closing the connection.
                        while matches!(stream.read(&mut chunk).await, Ok(n) if n > 0) {}
                        return;
                    }
                    let body = if scrape { BODY } else { "ok" };
                    let close = match after {
                        AfterAnswer::SayCloseAndClose => "connection: close\r\n",
                        _ => "",
                    };
                    let status = match after {
                        AfterAnswer::Unavailable if scrape => "503 Service Unavailable",
                        _ => "200 OK",
                    };
                    let answer = match after {
                        AfterAnswer::NotHttp if scrape => "SSH-2.0-OpenSSH_9.6\r\n".to_owned(),
                        _ => format!(
                            "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{close}\r\n{body}",
                            body.len()
                        ),
                    };
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    if scrape {
                        seen.send_modify(|s| {
                            s.scrapes += 1;
                            s.connections += u64::from(!scraped_here);
                        });
                        scraped_here = true;
                    }
                    if matches!(
                        after,
                        AfterAnswer::SayCloseAndClose | AfterAnswer::CloseSilently
                    ) {
                        return;
                    }
                }
            });
        }
    });
    (addr, watch)
}

fn config(addr: SocketAddr) -> Config {
    let mut config = Config::default();
    config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
    config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
    config.load.source = LoadSource::WorkerMetrics;
    config.load.scrape_interval = Duration::from_millis(20);
    config.load.stale_after = Duration::from_millis(1_000);
    config.workers = vec![WorkerConfig {
        name: Some("w".into()),
        ..WorkerConfig::from_url(&format!("http://{addr}"))
    }];
    config
}

/// Waits (bounded) until the worker has seen what `cond` asks for.
async fn wait_seen(
    seen: &mut watch::Receiver<Seen>,
    what: &str,
    cond: impl Fn(&Seen) -> bool,
) -> Seen {
    let waited = tokio::time::timeout(Duration::from_secs(20), seen.wait_for(|s| cond(s)))
        .await
        .map(|r| r.map(|s| *s));
    match waited {
        Ok(Ok(s)) => s,
        _ => panic!("{what}: the worker saw {:?}", *seen.borrow()),
    }
}

/// Waits (bounded) until the gateway has closed every connection that carried a scrape.
async fn wait_all_closed(seen: &mut watch::Receiver<Seen>) {
    // Every connection, not the first: on a loaded machine a scrape can outlast its timeout and
    // the scraper opens a second connection, whose close comes after the first one's.
    wait_seen(seen, "every connection of the scraper closed", |s| {
        s.closed_by_gateway >= 1 && s.closed_by_gateway == s.connections
    })
    .await;
}

/// The sum of every series of `family` in `/metrics` text.
fn total(metrics: &str, family: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Polls the gateway's `/metrics` text (bounded) until `done` holds; answers that text.
async fn wait_metrics(gateway: &RunningGateway, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = gateway.metrics_text();
        if done(&metrics) {
            return metrics;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {metrics}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn one_kept_alive_connection_carries_every_scrape() {
    let (addr, mut seen) = counting_worker(AfterAnswer::KeepAlive).await;
    let gateway = common::start(config(addr)).await;
    let seen_now = wait_seen(&mut seen, "twenty scrapes", |s| s.scrapes >= 20).await;
    assert_eq!(seen_now.connections, 1, "{seen_now:?}");
    assert_eq!(seen_now.closed_by_gateway, 0, "{seen_now:?}");
    let metrics = gateway.metrics_text();
    assert_eq!(
        total(&metrics, "bch_load_scrape_failures_total"),
        0,
        "{metrics}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_worker_that_closes_its_connections_costs_no_failed_scrape() {
    for after in [AfterAnswer::SayCloseAndClose, AfterAnswer::CloseSilently] {
        let (addr, mut seen) = counting_worker(after).await;
        let gateway = common::start(config(addr)).await;
        let seen_now = wait_seen(&mut seen, "twenty scrapes", |s| s.scrapes >= 20).await;
        // Every scrape needed a connection of its own, and none was counted as a failure.
        assert!(
            seen_now.connections >= seen_now.scrapes,
            "{after:?}: {seen_now:?}"
        );
        // The gateway counts a round once all of it is in; the worker counts each answer.
        let metrics = wait_metrics(&gateway, &format!("{after:?}: twenty scrapes"), |m| {
            total(m, "bch_load_scrapes_total") >= 20
        })
        .await;
        assert_eq!(
            total(&metrics, "bch_load_scrape_failures_total"),
            0,
            "{after:?}: {metrics}"
        );
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn the_scraper_closes_its_connection_when_the_gateway_shuts_down() {
    let (addr, mut seen) = counting_worker(AfterAnswer::KeepAlive).await;
    let gateway = common::start(config(addr)).await;
    wait_seen(&mut seen, "a scrape", |s| s.scrapes >= 2).await;
    gateway.shutdown().await;
    wait_all_closed(&mut seen).await;
}

#[tokio::test]
async fn the_scraper_stops_when_the_gateways_runtime_is_dropped() {
    let (addr, mut seen) = counting_worker(AfterAnswer::KeepAlive).await;
    let config = config(addr);
    let mut seen_in_thread = seen.clone();
    // A gateway on a runtime of its own that is dropped without a shutdown, as a test or an
    // embedding program that just returns does.
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let gateway = gatewayd::start(gatewayd::StartOptions::new(config))
                .await
                .unwrap();
            wait_seen(&mut seen_in_thread, "a scrape", |s| s.scrapes >= 2).await;
            drop(gateway);
        });
    });
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    wait_all_closed(&mut seen).await;
}

/// The sum of `family`'s series of worker `name` whose labels include `label`.
fn worker_total(metrics: &str, family: &str, name: &str, label: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{worker=\"{name}\"")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn discovered_workers_are_scraped_at_their_sources_metrics_path() {
    let (good, mut good_seen) = counting_worker(AfterAnswer::KeepAlive).await;
    let (elsewhere, _) = counting_worker(AfterAnswer::KeepAlive).await;
    let loopback = Some(std::net::IpAddr::from([127, 0, 0, 1]));
    let zone = Zone::default()
        .srv(
            "_good._tcp.llm.test",
            "good.llm.test",
            good.port(),
            loopback,
        )
        .srv(
            "_elsewhere._tcp.llm.test",
            "elsewhere.llm.test",
            elsewhere.port(),
            loopback,
        );
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let source = |name: &str, metrics_path: Option<&str>| DiscoveryConfig {
        resolver: Some(dns.address()),
        interval: Duration::from_millis(200),
        metrics_path: metrics_path.map(str::to_owned),
        ..DiscoveryConfig::new(name)
    };
    let mut config = config(good);
    config.workers.clear();
    config.discovery = vec![
        source("_good._tcp.llm.test", None),
        source("_elsewhere._tcp.llm.test", Some("/engine/metrics")),
    ];
    let gateway = common::start(config).await;
    // The default path: scraped, on one connection, the load read.
    wait_seen(&mut good_seen, "scrapes of the discovered worker", |s| {
        s.scrapes >= 5
    })
    .await;
    // The source's own path: the worker answers it with its plain 200 "ok", no gauges, so each
    // scrape there fails as no_gauges (not bad_uri: the target exists).
    let metrics = wait_metrics(&gateway, "both sources scraped", |m| {
        let failures = "bch_load_scrape_failures_total";
        worker_total(m, "bch_load_scrapes_total", "good.llm.test", "") >= 5
            && worker_total(m, failures, "elsewhere.llm.test", "reason=\"no_gauges\"") >= 2
    })
    .await;
    for name in ["good.llm.test", "elsewhere.llm.test"] {
        assert_eq!(
            worker_total(
                &metrics,
                "bch_load_scrape_failures_total",
                name,
                "reason=\"bad_uri\""
            ),
            0,
            "{name}: {metrics}"
        );
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn switching_to_local_closes_the_scrapers_connections() {
    let (addr, mut seen) = counting_worker(AfterAnswer::KeepAlive).await;
    let gateway = common::start(config(addr)).await;
    wait_seen(&mut seen, "a scrape", |s| s.scrapes >= 2).await;
    let switched = common::client()
        .put(format!("http://{}/admin/policy", gateway.control_addr))
        .json(&serde_json::json!({"load_source": "local"}))
        .send()
        .await
        .unwrap();
    assert!(switched.status().is_success());
    // In `local` mode nobody polls an idle connection; a kept one would sit in CLOSE-WAIT
    // once the worker closed it.
    wait_all_closed(&mut seen).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_hung_worker_does_not_age_the_other_workers_samples() {
    let (good, mut good_seen) = counting_worker(AfterAnswer::KeepAlive).await;
    let (hung, _) = counting_worker(AfterAnswer::HangScrapes).await;
    let mut config = config(good);
    // Rounds of one second; the hung worker's scrape runs to the 800 ms deadline every round.
    config.load.scrape_interval = Duration::from_millis(1_000);
    config.load.stale_after = Duration::from_millis(5_000);
    config.workers.push(WorkerConfig {
        name: Some("hung".into()),
        ..WorkerConfig::from_url(&format!("http://{hung}"))
    });
    let gateway = common::start(config).await;
    let before = wait_seen(&mut good_seen, "a scrape", |s| s.scrapes >= 1).await;
    // The youngest sample of the good worker seen over three rounds: published as it arrives it
    // is a few ms old; published at the round's end it would be at least 800 ms old.
    let mut youngest = u64::MAX;
    while good_seen.borrow().scrapes < before.scrapes + 3 {
        let record = common::worker_record(&gateway, "w").await.unwrap();
        if let Some(age) = record["scrape_age_ms"].as_u64() {
            youngest = youngest.min(age);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        youngest < 500,
        "the good worker's youngest sample was {youngest} ms old"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_refusing_worker_keeps_its_connection_and_a_foreign_protocol_is_named() {
    for (after, reason, one_connection) in [
        (AfterAnswer::Unavailable, "http_status", true),
        (AfterAnswer::NotHttp, "bad_response", false),
    ] {
        let (addr, mut seen) = counting_worker(after).await;
        let gateway = common::start(config(addr)).await;
        let seen_now = wait_seen(&mut seen, "ten scrapes", |s| s.scrapes >= 10).await;
        if one_connection {
            // A whole answer was read, so the next scrape reuses the connection: a fleet without
            // metrics does not pay a new connection per worker per round.
            assert_eq!(seen_now.connections, 1, "{after:?}: {seen_now:?}");
        }
        let label = format!("reason=\"{reason}\"");
        let failures = "bch_load_scrape_failures_total";
        let metrics = wait_metrics(&gateway, &format!("{after:?}: five {reason}"), |m| {
            worker_total(m, failures, "w", &label) >= 5
        })
        .await;
        assert_eq!(
            worker_total(&metrics, failures, "w", &label),
            total(&metrics, failures),
            "{after:?}: only {reason} failures: {metrics}"
        );
        gateway.shutdown().await;
    }
}
