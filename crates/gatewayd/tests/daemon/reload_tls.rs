//! `gatewayd reload` against a control plane that speaks TLS, made here (tokio-rustls in front of a
//! stand-in `POST /admin/reload`, certificates from an rcgen CA): `--ca-file` trusts it, a
//! configuration file that gives the control plane a certificate is reached over https, mutual
//! TLS with `--client-cert`/`--client-key`, and a wrong CA or a missing client certificate exit 1
//! saying TLS and what failed. Certificates are always verified.

use std::path::Path;

use axum::Router;
use axum::routing::post;
use bch_tls::server::server_config;
use bch_tls::test_pki::{Identity, Pki};
use tokio_rustls::TlsAcceptor;

use super::*;

/// A stand-in control plane on 127.0.0.1:0 whose `POST /admin/reload` succeeds, behind TLS with
/// `cert`/`key`, requiring client certificates from `client_ca` when given. Answers its port.
async fn tls_control_plane(cert: &Path, key: &Path, client_ca: Option<&Path>) -> u16 {
    let acceptor = TlsAcceptor::from(server_config(cert, key, client_ca).unwrap());
    let app = Router::new().route(
        "/admin/reload",
        post(|| async {
            axum::Json(
                serde_json::json!({ "policy": { "kind": "consistent_hashing" }, "workers": [] }),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A refused handshake is a case under test: the connection just ends.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |request| {
                    tower::ServiceExt::oneshot(app.clone(), request)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    port
}

/// `gatewayd reload ARGS` (off the runtime's threads): exit status and stderr.
async fn reload(args: Vec<String>) -> (Option<i32>, String) {
    let output = tokio::task::spawn_blocking(move || {
        gatewayd()
            .arg("reload")
            .args(args)
            .env_remove("GATEWAYD_ADMIN_TOKEN_FILE")
            .env_remove("GATEWAYD_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gatewayd_reload_reaches_a_control_plane_over_tls() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("control", &["localhost", "127.0.0.1"]);
    let port = tls_control_plane(&cert, &key, None).await;
    let control = format!("https://localhost:{port}");
    let ca = pki.ca_file().display().to_string();

    let (code, stderr) = reload(strings(&["--control", &control, "--ca-file", &ca])).await;
    assert_eq!(code, Some(0), "{stderr}");

    // The file's control plane has a certificate: reached over https on its control_listen.
    let file = TempFile::new(&format!(
        "[server]\ncontrol_listen = \"127.0.0.1:{port}\"\n\n[control.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        cert.display(),
        key.display()
    ));
    let config = file.path().display().to_string();
    let (code, stderr) = reload(strings(&["--config", &config, "--ca-file", &ca])).await;
    assert_eq!(code, Some(0), "{stderr}");

    // Another CA's trust: exit 1, saying the certificate is not trusted.
    let other = Pki::new("another CA");
    let (code, stderr) = reload(strings(&[
        "--control",
        &control,
        "--ca-file",
        &other.ca_file().display().to_string(),
    ]))
    .await;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("TLS: server certificate not trusted"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gatewayd_reload_presents_a_client_certificate_to_a_mutual_tls_control_plane() {
    let pki = Pki::new("bch test CA");
    let Identity { cert, key } = pki.issue("control", &["localhost"]);
    let Identity {
        cert: client_cert,
        key: client_key,
    } = pki.issue("operator", &["operator"]);
    let port = tls_control_plane(&cert, &key, Some(&pki.ca_file())).await;
    let control = format!("https://localhost:{port}");
    let ca = pki.ca_file().display().to_string();
    let (code, stderr) = reload(strings(&[
        "--control",
        &control,
        "--ca-file",
        &ca,
        "--client-cert",
        &client_cert.display().to_string(),
        "--client-key",
        &client_key.display().to_string(),
    ]))
    .await;
    assert_eq!(code, Some(0), "{stderr}");

    let (code, stderr) = reload(strings(&["--control", &control, "--ca-file", &ca])).await;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("TLS: the server refused the client certificate"),
        "{stderr}"
    );
}
