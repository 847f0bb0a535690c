//! The three listeners over TLS with real clients: the data plane to a worker, the control
//! plane's API, `/metrics` and `/ws`, the picker's ext_proc over h2; mutual TLS accepted and
//! refused; a plain HTTP request and a handshake that never completes.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::envoy::{picked, request_headers};
use super::common::*;
use super::*;

/// A gateway whose data plane, control plane and picker serve `pki`'s certificate; the control
/// plane and the picker ask for the CA's client certificates when `mutual`.
async fn tls_gateway(pki: &Pki, worker: &FakeWorker, mutual: bool) -> gatewayd::RunningGateway {
    let mut config = test_config(&[worker]);
    config.server.tls = Some(pki.listener(false));
    config.control.tls = mutual.then(|| pki.listener(true));
    config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    config.picker.tls = mutual.then(|| pki.listener(true));
    start(config).await
}

#[tokio::test]
async fn the_data_plane_and_the_control_plane_serve_tls_with_http1_alpn() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let gateway = tls_gateway(&pki, &worker, false).await;
    let client = pki.client(None, &[b"h2", b"http/1.1"]);

    let answer = get(gateway.data_addr, client.clone(), "/echo", &[])
        .await
        .expect("data plane over TLS");
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(answer.serial, serial_hex(1));
    assert_eq!(
        worker
            .state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    let workers = get(gateway.control_addr, client.clone(), "/admin/workers", &[])
        .await
        .expect("control plane over TLS");
    assert_eq!(workers.status, 200);
    assert!(workers.body.contains("\"w\""), "{}", workers.body);
    let metrics = get(gateway.control_addr, client.clone(), "/metrics", &[])
        .await
        .unwrap()
        .body;
    for listener in ["data", "control", "picker"] {
        let expiry = metric(
            &metrics,
            &format!("bch_tls_certificate_expiry_seconds{{listener=\"{listener}\"}}"),
        )
        .unwrap_or_else(|| panic!("{listener} expiry in {metrics}"));
        // rcgen's default notAfter is the year 4096.
        assert!(expiry > 4.0e10, "{expiry}");
    }

    // Plain HTTP clients are not served on a TLS port.
    let plain = bch_drill::tls::get(format!("http://{}/echo", gateway.data_addr)).await;
    assert_eq!(plain.map(|r| r.status().as_u16()).ok(), Some(400));

    assert!(all_idle(&gateway).await, "in-flight loads back to 0");
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_telemetry_websocket_runs_over_tls() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let gateway = tls_gateway(&pki, &worker, true).await;
    let stream = connect(
        gateway.control_addr,
        pki.client(Some("client"), &[b"http/1.1"]),
    )
    .await
    .expect("mutual TLS with the CA's client certificate");
    let (mut socket, _) = tokio_tungstenite::client_async("wss://localhost/ws", stream)
        .await
        .expect("websocket upgrade over TLS");
    let frame = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("a frame within 5 s")
        .expect("socket open")
        .expect("valid frame");
    assert!(frame.to_text().unwrap().contains("\"seq\""), "{frame:?}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn mutual_tls_admits_the_cas_clients_and_refuses_others_on_control_and_picker() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let gateway = tls_gateway(&pki, &worker, true).await;
    let picker = gateway.picker_addr.unwrap();

    let admitted = get(
        gateway.control_addr,
        pki.client(Some("client"), &[b"http/1.1"]),
        "/admin/workers",
        &[],
    )
    .await
    .expect("the CA's client certificate is admitted");
    assert_eq!(admitted.status, 200);
    for identity in [None, Some("rogue")] {
        for (addr, alpn) in [
            (gateway.control_addr, &b"http/1.1"[..]),
            (picker, &b"h2"[..]),
        ] {
            let refused = get(addr, pki.client(identity, &[alpn]), "/", &[]).await;
            assert!(refused.is_err(), "{identity:?} on {addr} was served");
        }
    }
    // The data plane asks for no client certificate.
    let data = get(gateway.data_addr, pki.client(None, &[]), "/echo", &[]).await;
    assert_eq!(data.unwrap().status, 200);

    // Envoy's side: an ext_proc stream over h2 with the client certificate.
    let config = pki.client(Some("client"), &[b"h2"]);
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let config = config.clone();
            async move {
                let stream = connect(picker, config).await?;
                assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .expect("picker over TLS");
    let mut client = ExternalProcessorClient::new(channel);
    let (to_picker, receiver) = tokio::sync::mpsc::channel(4);
    to_picker
        .send(request_headers(&[("x-smg-routing-key", "k")]))
        .await
        .unwrap();
    let outbound = tokio_stream_of(receiver);
    let mut answers = client.process(outbound).await.unwrap().into_inner();
    let answer = answers.message().await.unwrap().expect("an answer");
    let (header, _) = picked(&answer);
    assert_eq!(header, worker.addr.to_string());
    drop(to_picker);
    while answers.message().await.ok().flatten().is_some() {}

    let metrics = get(
        gateway.control_addr,
        pki.client(Some("client"), &[]),
        "/metrics",
        &[],
    )
    .await
    .unwrap()
    .body;
    for listener in ["control", "picker"] {
        let refused = metric(
            &metrics,
            &format!(
                "bch_tls_handshake_failures_total{{listener=\"{listener}\",reason=\"client_certificate\"}}"
            ),
        );
        assert_eq!(refused, Some(2.0), "{listener}: {metrics}");
    }
    assert!(all_idle(&gateway).await, "in-flight loads back to 0");
    gateway.shutdown().await;
}

fn tokio_stream_of<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

#[tokio::test]
async fn a_plain_request_on_a_tls_port_is_answered_and_closed_at_once() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    config.server.tls = Some(pki.listener(false));
    config.server.timeouts.tls_handshake = Duration::from_secs(30);
    let gateway = start(config).await;
    let started = Instant::now();
    let mut tcp = TcpStream::connect(gateway.data_addr).await.unwrap();
    tcp.write_all(b"GET /echo HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply))
        .await
        .expect("closed long before the 30 s handshake timeout")
        .expect("a clean close, not a reset");
    assert!(started.elapsed() < Duration::from_secs(5));
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
    assert!(reply.contains("speaks TLS"), "{reply}");
    let metrics = get(gateway.control_addr, pki.client(None, &[]), "/metrics", &[])
        .await
        .unwrap()
        .body;
    let series = "bch_tls_handshake_failures_total{listener=\"data\",reason=\"plain_http\"}";
    assert_eq!(metric(&metrics, series), Some(1.0), "{metrics}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_handshake_that_never_completes_is_cut_and_frees_its_connection_slot() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    config.server.tls = Some(pki.listener(false));
    config.server.limits.max_connections = 1;
    let timeout = Duration::from_millis(300);
    config.server.timeouts.tls_handshake = timeout;
    let gateway = start(config).await;

    // The first bytes of a TLS record, then nothing: the one connection slot is held.
    let mut stalled = TcpStream::connect(gateway.data_addr).await.unwrap();
    let opened = Instant::now();
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    // While the slot is held a second connection is refused (the handshake counts against
    // max_connections).
    let mut refused = TcpStream::connect(gateway.data_addr).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), refused.read_to_end(&mut answer))
        .await
        .expect("refused at once")
        .expect("read the refusal");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stalled.read_to_end(&mut rest))
        .await
        .expect("the stalled handshake is cut by its timeout");
    assert!(opened.elapsed() >= timeout, "{:?}", opened.elapsed());

    let answer = get(gateway.data_addr, pki.client(None, &[]), "/echo", &[])
        .await
        .expect("the freed slot serves the next client");
    assert_eq!(answer.status, 200);
    let metrics = gateway.metrics_text();
    let series = "bch_tls_handshake_failures_total{listener=\"data\",reason=\"timeout\"}";
    assert_eq!(metric(&metrics, series), Some(1.0), "{metrics}");
    assert!(all_idle(&gateway).await, "in-flight loads back to 0");
    gateway.shutdown().await;
}
