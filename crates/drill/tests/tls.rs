//! The drill as a TLS client: a storm at an https gateway and its drain check on an https control
//! plane that requires client certificates, both made here (tokio-rustls in front of a simulated
//! worker and a tiny control plane, certificates from an rcgen CA). A wrong CA and a missing
//! client certificate give errors that say TLS and what failed; the binary takes the CA from
//! `--ca-file`. Certificates are always verified.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use bch_drill::sim::SimConfig;
use bch_drill::storm::{StormConfig, run_storm};
use bch_drill::tls::ClientTls;
use bch_drill::worker::spawn_worker;
use bch_tls::server::server_config;
use bch_tls::test_pki::{Identity, Pki};
use reqwest::Url;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// TLS terminated on 127.0.0.1:0 in front of the plain HTTP server at `backend`: answers
/// `https://localhost:PORT`.
async fn terminate_tls(backend: SocketAddr, tls: Arc<rustls::ServerConfig>) -> Url {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A refused handshake is a case under test: the connection just ends.
                let Ok(mut front) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut back = TcpStream::connect(backend).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut front, &mut back).await;
            });
        }
    });
    Url::parse(&format!("https://localhost:{port}")).unwrap()
}

/// A control plane whose one worker is idle: `GET /admin/workers` on plain HTTP.
async fn idle_control_plane() -> SocketAddr {
    let app = Router::new().route(
        "/admin/workers",
        get(|| async { axum::Json(serde_json::json!({ "workers": [] })) }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn small(gateway: Url, control: Url, tls: ClientTls) -> StormConfig {
    StormConfig {
        gateway,
        control: Some(control),
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
    }
}

#[tokio::test]
async fn a_storm_at_an_https_gateway_with_an_mtls_control_plane() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("gateway", &["localhost"]);
    let Identity {
        cert: client_cert,
        key: client_key,
    } = pki.issue("drill", &["bch-drill"]);
    let worker = spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "w",
        SimConfig {
            time_scale: 0.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let gateway = terminate_tls(
        worker.local_addr(),
        server_config(&cert, &key, None).unwrap(),
    )
    .await;
    let control = terminate_tls(
        idle_control_plane().await,
        server_config(&cert, &key, Some(&pki.ca_file())).unwrap(),
    )
    .await;

    // The CA and the client certificate: every request answered, the drain check asked.
    let tls =
        ClientTls::from_files(Some(&pki.ca_file()), Some(&client_cert), Some(&client_key)).unwrap();
    let report = run_storm(&small(gateway.clone(), control.clone(), tls))
        .await
        .unwrap();
    assert_eq!(report.requests, 8, "{report}");
    assert_eq!(report.status_counts.get(&200), Some(&8), "{report}");
    let drain = report.drain.expect("a control plane was given");
    assert!(drain.all_zero, "{:?}", drain.replicas);
    let stats = worker.stats();
    assert_eq!(
        (stats.completed_total, stats.running, stats.waiting),
        (8, 0, 0)
    );

    // The CA without the client certificate: the storm runs, and the drain check names the
    // control plane that refused it, saying why.
    let tls = ClientTls::from_files(Some(&pki.ca_file()), None, None).unwrap();
    let report = run_storm(&small(gateway.clone(), control.clone(), tls))
        .await
        .unwrap();
    assert_eq!(report.status_counts.get(&200), Some(&8), "{report}");
    let drain = report.drain.expect("a control plane was given");
    let error = drain.replicas[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("TLS: the server refused the client certificate"),
        "{error}"
    );

    // Another CA's trust: the preflight fails at once, saying the certificate is not trusted.
    let other = Pki::new("another CA");
    let tls = ClientTls::from_files(Some(&other.ca_file()), None, None).unwrap();
    let error = run_storm(&small(gateway, control, tls)).await.unwrap_err();
    let error = format!("{error:#}");
    assert!(
        error.contains("TLS: server certificate not trusted"),
        "{error}"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_the_ca_file() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("gateway", &["localhost"]);
    let worker = spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "w",
        SimConfig {
            time_scale: 0.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let gateway = terminate_tls(
        worker.local_addr(),
        server_config(&cert, &key, None).unwrap(),
    )
    .await;
    let storm = |ca: PathBuf| {
        let gateway = gateway.to_string();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_bch-drill"))
                .args(["storm", "--gateway", &gateway, "--ca-file"])
                .arg(ca)
                .args(["--groups", "2", "--siblings", "2", "--keys", "1"])
                .args(["--prefix-tokens", "16", "--max-tokens", "2", "--seed", "1"])
                .env_remove("BCH_CONTROL")
                .env_remove("BCH_CLIENT_CERT")
                .env_remove("BCH_CLIENT_KEY")
                .output()
                .unwrap()
        })
    };

    let output = storm(pki.ca_file()).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(worker.stats().completed_total, 4);

    let other = Pki::new("another CA");
    let output = storm(other.ca_file()).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("TLS: server certificate not trusted"),
        "{stderr}"
    );
    worker.shutdown().await.unwrap();
}

#[test]
fn tls_files_that_cannot_be_used_are_named() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("drill", &["bch-drill"]);
    let missing = pki.path("absent.crt");
    let error = ClientTls::from_files(Some(&missing), None, None).unwrap_err();
    assert!(format!("{error:#}").contains("absent.crt"), "{error:#}");
    // A key given as the CA holds no CA certificate.
    let error = ClientTls::from_files(Some(&key), None, None).unwrap_err();
    assert!(
        format!("{error:#}").contains("holds no CA certificate"),
        "{error:#}"
    );
    let error = ClientTls::from_files(None, Some(&cert), None).unwrap_err();
    assert!(format!("{error:#}").contains("go together"), "{error:#}");
}
