//! A 1,000-record DNS answer is applied off the request path: while the whole discovered set is
//! replaced again and again (1,000 workers leave, 1,000 join, each time a new ring and table),
//! requests keep being answered, none waiting for an apply.

use crate::common;
use crate::dnsmasq;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dnsmasq::{Dnsmasq, Zone};
use gatewayd::config::DiscoveryConfig;
use serde_json::json;

const NAME: &str = "big.llm.test";

/// 1,000 address records for `NAME` in `127.<block>.0.0/16` (nothing listens there).
fn fleet(block: u8) -> Vec<(IpAddr, String)> {
    (0..1000)
        .map(|i| {
            let address = IpAddr::from([127, block, (i / 250) as u8, (i % 250 + 1) as u8]);
            (address, NAME.to_owned())
        })
        .collect()
}

/// Discovered workers whose address is in `127.<block>.0.0/16`.
async fn discovered_in(gateway: &gatewayd::RunningGateway, block: u8) -> usize {
    let prefix = format!("http://127.{block}.");
    common::worker_records(gateway)
        .await
        .iter()
        .filter(|w| w["url"].as_str().unwrap().starts_with(&prefix))
        .count()
}

/// Polls (bounded) until all 1,000 workers of `block` are members.
async fn wait_discovered(gateway: &gatewayd::RunningGateway, block: u8) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while discovered_in(gateway, block).await != 1000 {
        assert!(Instant::now() < deadline, "127.{block}.0.0/16 never joined");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_answered_while_thousand_record_answers_are_applied() {
    let anchor = common::fake_worker("anchor").await;
    let Some(mut dns) = Dnsmasq::start(&Zone::addresses(fleet(1))) else {
        return;
    };
    let mut config = common::test_config(&[&anchor]);
    config.discovery = vec![DiscoveryConfig {
        resolver: Some(dns.address()),
        interval: Duration::from_millis(100),
        port: Some(8000),
        ..DiscoveryConfig::new(NAME)
    }];
    // Nothing listens on the discovered workers: one probe round a minute, not ten a second.
    config.health.interval = Duration::from_secs(60);
    let gateway = Arc::new(common::start(config).await);
    wait_discovered(&gateway, 1).await;

    // Requests pinned to the live worker, one after another, for as long as the answers change.
    let stop = Arc::new(AtomicBool::new(false));
    let requests = tokio::spawn({
        let (gateway, stop) = (Arc::clone(&gateway), Arc::clone(&stop));
        async move {
            let client = common::client();
            let mut slowest = Duration::ZERO;
            let mut answered = 0;
            while !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                let response = client
                    .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
                    .header("x-smg-target-worker", "anchor")
                    .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                response.bytes().await.unwrap();
                slowest = slowest.max(began.elapsed());
                answered += 1;
            }
            (answered, slowest)
        }
    });
    let began = Instant::now();
    for round in 0..2u8 {
        let block = 2 + round % 2;
        dns.set_addresses(&fleet(block));
        wait_discovered(&gateway, block).await;
    }
    let applying = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (answered, slowest) = requests.await.unwrap();
    assert!(
        answered > 0,
        "no request answered in {applying:?} of applies"
    );
    // Two applies of 2,000 membership changes each took `applying`; a request that waited for
    // one of them would take a large share of it.
    assert!(
        slowest < applying / 6,
        "a request took {slowest:?} while two answers were applied in {applying:?}"
    );
}
