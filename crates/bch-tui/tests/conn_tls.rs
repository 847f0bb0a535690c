//! The console over TLS against small wss:// gateways made here (tokio-rustls and tokio-tungstenite,
//! certificates from an rcgen CA): telemetry arrives over wss, with and without a client
//! certificate; a console mixes ws and wss replicas; and a handshake that fails shows what failed
//! (certificate not trusted, name mismatch, expired, client certificate refused) in the replica's
//! status. Certificates are always verified.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bch_tls::server::server_config;
use bch_tls::test_pki::{Identity, Pki, expired};
use bch_tui::{App, ConnConfig, ConnEvent, ConnHandle, ConnStatus, ReplicaId, State};
use common::frame;
use futures_util::SinkExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_tungstenite::tungstenite::Message;

/// Generous: only reached when something is broken, never part of a passing run's timing.
const WAIT: Duration = Duration::from_secs(10);

/// A telemetry websocket on 127.0.0.1:0 that sends a snapshot to every client and then holds the
/// connection: over TLS with `tls`, plain without. Answers its URL (`wss://localhost:PORT/ws` or
/// `ws://127.0.0.1:PORT/ws`).
async fn gateway(tls: Option<Arc<rustls::ServerConfig>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = match tls {
        Some(_) => format!("wss://localhost:{port}/ws"),
        None => format!("ws://127.0.0.1:{port}/ws"),
    };
    let acceptor = tls.map(TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let snapshot = Message::text(serde_json::to_string(&frame("snapshot")).unwrap());
                match acceptor {
                    Some(acceptor) => {
                        // A refused handshake is the case under test: the task just ends.
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                            return;
                        };
                        let _ = ws.send(snapshot).await;
                        std::future::pending::<()>().await;
                    }
                    None => {
                        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
                        let _ = ws.send(snapshot).await;
                        std::future::pending::<()>().await;
                    }
                }
            });
        }
    });
    url
}

/// The console's connection to `url` with the TLS configuration `bch-tui` builds from its flags.
fn connect(url: &str, ca: Option<&Path>, client: Option<&Identity>) -> ConnHandle {
    let mut config = ConnConfig::new(url);
    let tls = bch_tls::ClientTls::from_files(
        ca,
        client.map(|identity| identity.cert.as_path()),
        client.map(|identity| identity.key.as_path()),
    )
    .unwrap();
    config.tls = Some(tls.config());
    ConnHandle::spawn(config)
}

/// Waits for the first snapshot frame; panics on a failed attempt, with its reason.
async fn first_snapshot(events: &mut mpsc::UnboundedReceiver<ConnEvent>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("no snapshot in time")
            .expect("network task ended");
        match event {
            ConnEvent::Frame(_) => return,
            ConnEvent::Status(ConnStatus::Reconnecting { reason, .. }) => {
                panic!("the connection failed: {reason}")
            }
            _ => {}
        }
    }
}

/// The reason of the first failed attempt; panics if a frame arrives instead.
async fn first_failure(events: &mut mpsc::UnboundedReceiver<ConnEvent>) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("no failure in time")
            .expect("network task ended");
        match event {
            ConnEvent::Status(ConnStatus::Reconnecting { reason, .. }) => return reason,
            ConnEvent::Frame(_) => panic!("telemetry arrived where the handshake should fail"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn telemetry_arrives_over_wss_with_the_ca_given() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("server", &["localhost"]);
    let url = gateway(Some(server_config(&cert, &key, None).unwrap())).await;
    let mut handle = connect(&url, Some(&pki.ca_file()), None);
    first_snapshot(&mut handle.events).await;
}

#[tokio::test]
async fn mutual_tls_accepts_the_client_certificate_and_refuses_a_console_without_one() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("server", &["localhost"]);
    let client = pki.issue("console", &["bch-tui"]);
    let url = gateway(Some(
        server_config(&cert, &key, Some(&pki.ca_file())).unwrap(),
    ))
    .await;

    let mut with = connect(&url, Some(&pki.ca_file()), Some(&client));
    first_snapshot(&mut with.events).await;

    let mut without = connect(&url, Some(&pki.ca_file()), None);
    let reason = first_failure(&mut without.events).await;
    assert!(
        reason.starts_with("TLS: the server refused the client certificate"),
        "{reason}"
    );

    // A certificate from another CA is refused the same way.
    let rogue_ca = Pki::new("rogue CA");
    let rogue = rogue_ca.issue("rogue", &["bch-tui"]);
    let mut rogue = connect(&url, Some(&pki.ca_file()), Some(&rogue));
    let reason = first_failure(&mut rogue.events).await;
    assert!(
        reason.starts_with("TLS: the server refused the client certificate"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_failed_handshake_says_what_failed() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("server", &["localhost"]);
    let trusted = gateway(Some(server_config(&cert, &key, None).unwrap())).await;

    // Another CA's trust: the gateway's certificate is not trusted.
    let other = Pki::new("another CA");
    let mut handle = connect(&trusted, Some(&other.ca_file()), None);
    let reason = first_failure(&mut handle.events).await;
    assert!(
        reason.starts_with("TLS: server certificate not trusted"),
        "{reason}"
    );

    // A certificate for another name.
    let Identity { cert, key } = pki.issue("elsewhere", &["gateway.example"]);
    let url = gateway(Some(server_config(&cert, &key, None).unwrap())).await;
    let mut handle = connect(&url, Some(&pki.ca_file()), None);
    let reason = first_failure(&mut handle.events).await;
    assert!(
        reason.starts_with("TLS: server certificate name mismatch"),
        "{reason}"
    );

    // An expired certificate.
    let Identity { cert, key } = pki.issue_by("expired", pki.ca(), &["localhost"], expired);
    let url = gateway(Some(server_config(&cert, &key, None).unwrap())).await;
    let mut handle = connect(&url, Some(&pki.ca_file()), None);
    let reason = first_failure(&mut handle.events).await;
    assert!(
        reason.starts_with("TLS: server certificate expired"),
        "{reason}"
    );
}

#[tokio::test]
async fn one_console_watches_a_ws_and_a_wss_replica() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("server", &["localhost"]);
    let urls = vec![
        gateway(None).await,
        gateway(Some(server_config(&cert, &key, None).unwrap())).await,
    ];
    // As bch-tui wires it: one TLS configuration shared by every replica, events tagged.
    let tls = bch_tls::ClientTls::from_files(Some(&pki.ca_file()), None, None)
        .unwrap()
        .config();
    let (tagged_tx, mut tagged) = mpsc::unbounded_channel();
    let mut commands = Vec::new();
    for (index, url) in urls.iter().enumerate() {
        let mut config = ConnConfig::new(url.clone());
        config.tls = Some(Arc::clone(&tls));
        let mut handle = ConnHandle::spawn(config);
        commands.push(handle.commands);
        let forward = tagged_tx.clone();
        tokio::spawn(async move {
            while let Some(event) = handle.events.recv().await {
                let _ = forward.send((ReplicaId(index), event));
            }
        });
    }
    let mut app = App::with_replicas(State::for_replicas(urls), commands);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !app
        .state()
        .replicas()
        .iter()
        .all(|r| *r.conn() == ConnStatus::Connected && r.fleet().policy.is_some())
    {
        let (replica, event) = tokio::time::timeout_at(deadline, tagged.recv())
            .await
            .unwrap_or_else(|_| panic!("replicas: {:?}", app.state().replicas()))
            .unwrap();
        if let ConnEvent::Status(ConnStatus::Reconnecting { reason, .. }) = &event {
            panic!("replica {replica} failed: {reason}");
        }
        app.handle_replica_conn(replica, event);
    }
}
