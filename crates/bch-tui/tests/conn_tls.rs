//! The console over TLS against small wss:// gateways made here (tokio-rustls and tokio-tungstenite,
//! certificates from an rcgen CA): telemetry arrives over wss, with and without a client
//! certificate; a console mixes ws and wss replicas; and a handshake that fails shows what failed
//! (certificate not trusted, name mismatch, expired, client certificate refused) in the replica's
//! status. Certificates are always verified.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bch_tui::{App, ConnConfig, ConnEvent, ConnHandle, ConnStatus, ReplicaId, State};
use common::frame;
use futures_util::SinkExt;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_tungstenite::tungstenite::Message;

/// Generous: only reached when something is broken, never part of a passing run's timing.
const WAIT: Duration = Duration::from_secs(10);

/// A CA and the certificates it signs, written as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), cert.pem()).unwrap();
        Self {
            dir,
            ca: Issuer::new(params, key),
        }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A certificate for `names` signed by the CA, valid now (or, `expired`, only in 2020), as
    /// the paths of its certificate and key files.
    fn issue(&self, stem: &str, names: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let cert_file = self.dir.path().join(format!("{stem}.crt"));
        let key_file = self.dir.path().join(format!("{stem}.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS server configuration with `cert`/`key`, requiring client certificates from
/// `client_ca` when given.
fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for anchor in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(anchor.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    Arc::new(builder.with_single_cert(chain, key).unwrap())
}

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
fn connect(url: &str, ca: Option<&Path>, client: Option<&(PathBuf, PathBuf)>) -> ConnHandle {
    let mut config = ConnConfig::new(url);
    config.tls = Some(
        bch_tui::client_config(
            ca,
            client.map(|(cert, _)| cert.as_path()),
            client.map(|(_, key)| key.as_path()),
        )
        .unwrap(),
    );
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
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"], false);
    let url = gateway(Some(server_config(&cert, &key, None))).await;
    let mut handle = connect(&url, Some(&pki.ca_file()), None);
    first_snapshot(&mut handle.events).await;
}

#[tokio::test]
async fn mutual_tls_accepts_the_client_certificate_and_refuses_a_console_without_one() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"], false);
    let client = pki.issue("console", &["bch-tui"], false);
    let url = gateway(Some(server_config(&cert, &key, Some(&pki.ca_file())))).await;

    let mut with = connect(&url, Some(&pki.ca_file()), Some(&client));
    first_snapshot(&mut with.events).await;

    let mut without = connect(&url, Some(&pki.ca_file()), None);
    let reason = first_failure(&mut without.events).await;
    assert!(
        reason.starts_with("TLS: client certificate refused"),
        "{reason}"
    );

    // A certificate from another CA is refused the same way.
    let rogue_ca = Pki::new();
    let rogue = rogue_ca.issue("rogue", &["bch-tui"], false);
    let mut rogue = connect(&url, Some(&pki.ca_file()), Some(&rogue));
    let reason = first_failure(&mut rogue.events).await;
    assert!(
        reason.starts_with("TLS: client certificate refused"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_failed_handshake_says_what_failed() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"], false);
    let trusted = gateway(Some(server_config(&cert, &key, None))).await;

    // Another CA's trust: the gateway's certificate is not trusted.
    let other = Pki::new();
    let mut handle = connect(&trusted, Some(&other.ca_file()), None);
    let reason = first_failure(&mut handle.events).await;
    assert!(
        reason.starts_with("TLS: certificate not trusted"),
        "{reason}"
    );

    // A certificate for another name.
    let (cert, key) = pki.issue("elsewhere", &["gateway.example"], false);
    let url = gateway(Some(server_config(&cert, &key, None))).await;
    let mut handle = connect(&url, Some(&pki.ca_file()), None);
    let reason = first_failure(&mut handle.events).await;
    assert!(
        reason.starts_with("TLS: certificate name mismatch"),
        "{reason}"
    );

    // An expired certificate.
    let (cert, key) = pki.issue("expired", &["localhost"], true);
    let url = gateway(Some(server_config(&cert, &key, None))).await;
    let mut handle = connect(&url, Some(&pki.ca_file()), None);
    let reason = first_failure(&mut handle.events).await;
    assert!(reason.starts_with("TLS: certificate expired"), "{reason}");
}

#[tokio::test]
async fn one_console_watches_a_ws_and_a_wss_replica() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"], false);
    let urls = vec![
        gateway(None).await,
        gateway(Some(server_config(&cert, &key, None))).await,
    ];
    // As bch-tui wires it: one TLS configuration shared by every replica, events tagged.
    let tls = bch_tui::client_config(Some(&pki.ca_file()), None, None).unwrap();
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
