//! The background storm of `gatewayd --demo` against a simulated worker on 127.0.0.1, on real time
//! as the measured storm's tests are. It needs no Cargo feature: this is what gatewayd links.

use std::net::SocketAddr;
use std::time::Duration;

use bch_drill::sim::SimConfig;
use bch_drill::storm::{BackgroundStormConfig, background_storm};
use bch_drill::worker::{WorkerHandle, spawn_worker};
use reqwest::Url;
use tokio_util::sync::CancellationToken;

async fn worker() -> WorkerHandle {
    spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "w",
        SimConfig::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn the_background_storm_stops_after_its_group_limit() {
    let w = worker().await;
    let mut config = BackgroundStormConfig::new(Url::parse(&w.url()).unwrap());
    config.prefix_tokens = 32;
    config.max_tokens = 2;
    config.group_interval = Duration::from_millis(2);
    config.max_groups = Some(5);
    let summary = background_storm(config, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(summary.groups, 5);
    assert_eq!((summary.requests, summary.ok), (30, 30), "{summary:?}");
    assert_eq!(w.stats().completed_total, 30);
    assert!(w.stats().cached_tokens_total > 0);
}

#[tokio::test]
async fn the_background_storm_stops_when_cancelled() {
    let w = worker().await;
    let cancel = CancellationToken::new();
    let storm = tokio::spawn(background_storm(
        BackgroundStormConfig::new(Url::parse(&w.url()).unwrap()),
        cancel.clone(),
    ));
    cancel.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(10), storm)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(summary.groups <= 1, "{summary:?}");
}
