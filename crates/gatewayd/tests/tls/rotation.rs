//! Certificate rotation without a restart: a reload re-reads the files; a stream open across it
//! finishes on its old certificate, the next connection is served the new one (checked by the
//! served serial), and a bad new certificate is refused with the old one kept.

use std::time::Duration;

use http_body_util::BodyExt;

use super::common::*;
use super::*;

fn config_text(pki: &Pki, worker: &FakeWorker) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"127.0.0.1:0\"\n\n\
         [server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n\
         [health]\nwait_for_first_probe = false\n\n\
         [[workers]]\nname = \"w\"\nurl = \"{}\"\n",
        shown(&pki.path("server.crt")),
        shown(&pki.path("server.key")),
        worker.url()
    )
}

async fn reload(gateway: &gatewayd::RunningGateway, pki: &Pki) -> Answer {
    let stream = connect(gateway.control_addr, pki.client(None, &[]))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post("/admin/reload")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        serial: String::new(),
        alpn: None,
    }
}

#[tokio::test]
async fn a_reload_serves_the_new_certificate_to_new_connections_and_open_streams_finish() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let file = pki.path("gatewayd.toml");
    std::fs::write(&file, config_text(&pki, &worker)).unwrap();
    let config = gatewayd::config::Config::load(&file).unwrap();
    let gateway = gatewayd::start(gatewayd::StartOptions::new(config).config_file(file.clone()))
        .await
        .unwrap();
    let client = pki.client(None, &[]);

    // A stream in flight on the old certificate.
    let stream = connect(gateway.data_addr, client.clone()).await.unwrap();
    assert_eq!(served_serial(&stream), serial_hex(1));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get("/sse?n=20&gap_ms=25")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let mut body = sender.send_request(request).await.unwrap().into_body();
    let first = body.frame().await.expect("first event").unwrap();
    assert!(first.data_ref().is_some());

    pki.write_server(&leaf(pki.ca(), 2, None));
    let answer = reload(&gateway, &pki).await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the open stream finishes")
        .expect("no error on the old connection")
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "{rest:?}"
    );
    let next = get(gateway.data_addr, client.clone(), "/echo", &[])
        .await
        .unwrap();
    assert_eq!(
        next.serial,
        serial_hex(2),
        "the next connection's certificate"
    );

    // A key that does not match the certificate: refused, the serial-2 certificate stays.
    let (cert, _) = leaf(pki.ca(), 3, None);
    let (_, other_key) = leaf(pki.ca(), 4, None);
    pki.write_server(&(cert, other_key));
    let refused = reload(&gateway, &pki).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused
            .body
            .contains("the private key does not match the certificate"),
        "{}",
        refused.body
    );
    let after = get(gateway.data_addr, client.clone(), "/echo", &[])
        .await
        .unwrap();
    assert_eq!(after.serial, serial_hex(2));

    // An unreadable certificate: refused the same way.
    std::fs::remove_file(pki.path("server.crt")).unwrap();
    let refused = reload(&gateway, &pki).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("server.tls"), "{}", refused.body);
    assert_eq!(
        get(gateway.data_addr, client, "/echo", &[])
            .await
            .unwrap()
            .serial,
        serial_hex(2)
    );
    assert!(all_idle(&gateway).await, "in-flight loads back to 0");
    gateway.shutdown().await;
}
