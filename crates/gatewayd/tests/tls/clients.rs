//! The console and the drill as TLS clients of a real gateway: `bch-drill storm` at an https data
//! plane with its drain check on a control plane that requires client certificates, the console's
//! telemetry over wss (with and without a client certificate) and a console that mixes a ws and a
//! wss replica; a wrong CA or a missing client certificate say TLS and what failed.

use bch_drill::sim::SimConfig;
use bch_drill::storm::{StormConfig, run_storm};
use bch_drill::tls::ClientTls;
use bch_drill::worker::{WorkerHandle, spawn_worker};
use bch_tui::{ConnConfig, ConnEvent, ConnHandle, ConnStatus};
use gatewayd::config::{Config, WorkerConfig};
use reqwest::Url;
use tokio::sync::mpsc;

use super::common::*;
use super::*;

/// A simulated worker answering at once.
async fn sim_worker() -> WorkerHandle {
    spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "sim",
        SimConfig::default().with_time_scale(0.0),
    )
    .await
    .unwrap()
}

/// A gateway in front of `worker`; `tls` decides its listeners.
fn config_for(worker: &WorkerHandle) -> Config {
    let mut config = test_config(&[]);
    config.workers = vec![WorkerConfig {
        name: Some(worker.name().to_owned()),
        url: worker.url(),
        ring_id: None,
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    }];
    config
}

/// The CA file of the rogue authority, which signed nothing the gateway serves.
fn rogue_ca(pki: &Pki) -> PathBuf {
    pki.write("rogue-ca.crt", &pki.rogue.pem());
    pki.path("rogue-ca.crt")
}

#[tokio::test]
async fn a_drill_storm_at_the_https_data_plane_with_its_drain_check_over_mutual_tls() {
    let pki = Pki::generate();
    let worker = sim_worker().await;
    let mut config = config_for(&worker);
    config.server.tls = Some(pki.listener(false));
    config.control.tls = Some(pki.listener(true));
    let gateway = start(config).await;
    let storm = |tls: ClientTls| StormConfig {
        gateway: Url::parse(&format!("https://localhost:{}", gateway.data_addr.port())).unwrap(),
        control: Some(
            Url::parse(&format!(
                "https://localhost:{}",
                gateway.control_addr.port()
            ))
            .unwrap(),
        ),
        tls,
        groups: 4,
        siblings: 2,
        keys: 2,
        concurrency: 2,
        prefix_tokens: 16,
        suffix_tokens: 4,
        max_tokens: 2,
        progress: false,
        ..StormConfig::default()
    };

    let tls = ClientTls::from_files(
        Some(&pki.path("ca.crt")),
        Some(&pki.path("client.crt")),
        Some(&pki.path("client.key")),
    )
    .unwrap();
    let report = run_storm(&storm(tls)).await.unwrap();
    assert_eq!(report.status_counts.get(&200), Some(&8), "{report}");
    assert_eq!(report.per_worker.get("sim"), Some(&8), "{report}");
    let drain = report.drain.expect("a control plane was given");
    assert!(drain.all_zero, "{:?}", drain.replicas);
    assert_eq!(drain.unanswered().count(), 0, "{:?}", drain.replicas);

    // Without the client certificate the control plane refuses the drain check, saying why.
    let tls = ClientTls::from_files(Some(&pki.path("ca.crt")), None, None).unwrap();
    let report = run_storm(&storm(tls)).await.unwrap();
    assert_eq!(report.status_counts.get(&200), Some(&8), "{report}");
    let error = report.drain.unwrap().replicas[0]
        .error
        .clone()
        .unwrap_or_default();
    assert!(
        error.contains("TLS: the server refused the client certificate"),
        "{error}"
    );

    // A CA that did not sign the gateway's certificate: the storm stops at its preflight.
    let tls = ClientTls::from_files(Some(&rogue_ca(&pki)), None, None).unwrap();
    let error = format!("{:#}", run_storm(&storm(tls)).await.unwrap_err());
    assert!(
        error.contains("TLS: server certificate not trusted"),
        "{error}"
    );

    assert!(all_idle(&gateway).await, "in-flight loads back to 0");
    gateway.shutdown().await;
    worker.shutdown().await.unwrap();
}

/// The console's connection to `url`, with the TLS configuration bch-tui builds from its flags.
fn console(url: String, ca: &Path, identity: Option<(&Path, &Path)>) -> ConnHandle {
    let mut config = ConnConfig::new(url);
    let tls = bch_tls::ClientTls::from_files(
        Some(ca),
        identity.map(|(cert, _)| cert),
        identity.map(|(_, key)| key),
    )
    .unwrap();
    config.tls = Some(tls.config());
    ConnHandle::spawn(config)
}

/// The first telemetry frame (`Ok`) or the reason of the first failed attempt (`Err`).
async fn first_frame(events: &mut mpsc::UnboundedReceiver<ConnEvent>) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("neither a frame nor a failure in time")
            .expect("network task ended");
        match event {
            ConnEvent::Frame(_) => return Ok(()),
            ConnEvent::Status(ConnStatus::Reconnecting { reason, .. }) => return Err(reason),
            _ => {}
        }
    }
}

#[tokio::test]
async fn the_console_over_wss_with_and_without_a_client_certificate() {
    let pki = Pki::generate();
    let worker = sim_worker().await;
    let mut config = config_for(&worker);
    config.control.tls = Some(pki.listener(true));
    let gateway = start(config).await;
    let url = format!("wss://localhost:{}/ws", gateway.control_addr.port());
    let (ca, cert, key) = (
        pki.path("ca.crt"),
        pki.path("client.crt"),
        pki.path("client.key"),
    );

    let mut with = console(url.clone(), &ca, Some((&cert, &key)));
    first_frame(&mut with.events)
        .await
        .expect("telemetry over wss with the client certificate");

    let mut without = console(url.clone(), &ca, None);
    let reason = first_frame(&mut without.events).await.unwrap_err();
    assert!(
        reason.starts_with("TLS: the server refused the client certificate"),
        "{reason}"
    );

    let mut untrusting = console(url, &rogue_ca(&pki), Some((&cert, &key)));
    let reason = first_frame(&mut untrusting.events).await.unwrap_err();
    assert!(
        reason.starts_with("TLS: server certificate not trusted"),
        "{reason}"
    );

    for handle in [with, without, untrusting] {
        handle.task.abort();
    }
    gateway.shutdown().await;
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_console_watches_a_plain_and_a_tls_replica() {
    let pki = Pki::generate();
    let worker = sim_worker().await;
    let plain = start(config_for(&worker)).await;
    let mut config = config_for(&worker);
    config.control.tls = Some(pki.listener(false));
    let tls = start(config).await;
    let urls = [
        format!("ws://{}/ws", plain.control_addr),
        format!("wss://localhost:{}/ws", tls.control_addr.port()),
    ];
    // As bch-tui wires it: one TLS configuration for every replica; ws:// ignores it.
    let shared = bch_tls::ClientTls::from_files(Some(&pki.path("ca.crt")), None, None)
        .unwrap()
        .config();
    for url in urls {
        let mut config = ConnConfig::new(url.clone());
        config.tls = Some(Arc::clone(&shared));
        let mut handle = ConnHandle::spawn(config);
        first_frame(&mut handle.events)
            .await
            .unwrap_or_else(|reason| panic!("{url}: {reason}"));
        handle.task.abort();
    }
    plain.shutdown().await;
    tls.shutdown().await;
    worker.shutdown().await.unwrap();
}
