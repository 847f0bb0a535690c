//! Rotation by SIGHUP on the real daemon: a stream in flight across the signal finishes, and the
//! next connection is served the new certificate (by its serial).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use http_body_util::BodyExt;

use super::common::*;
use super::*;

/// The daemon, killed on drop, with its stderr lines.
struct Daemon {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// The first stderr line containing `needle`, within 20 s.
    fn line_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with {needle:?} within 20 s"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    fn hang_up(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

#[tokio::test]
async fn sighup_rotates_the_certificate_while_a_stream_is_in_flight() {
    let pki = Pki::generate();
    let worker = fake_worker("w").await;
    let file = pki.path("gatewayd.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"127.0.0.1:0\"\n\n\
             [server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n\
             [health]\nwait_for_first_probe = false\n\n\
             [[workers]]\nname = \"w\"\nurl = \"{}\"\n",
            shown(&pki.path("server.crt")),
            shown(&pki.path("server.key")),
            worker.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gatewayd"))
        .arg("--config")
        .arg(&file)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gatewayd runs");
    let (sender, lines) = mpsc::channel();
    let pipe = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in pipe.lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let daemon = Daemon { child, lines };
    let started = daemon.line_with("gatewayd started");
    let data: SocketAddr = started
        .split("data_plane=https://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("data plane address in {started:?}"))
        .parse()
        .unwrap();
    assert!(started.contains("control_plane=https://"), "{started}");
    let client = pki.client(None, &[]);

    let stream = connect(data, client.clone()).await.unwrap();
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
    assert!(body.frame().await.expect("first event").is_ok());

    pki.write_server(&leaf(pki.ca(), 2, None));
    daemon.hang_up();
    let rotated = daemon.line_with("TLS certificate in force");
    assert!(
        rotated.contains("listener=\"data\"") && rotated.contains("serial=02"),
        "{rotated}"
    );

    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the open stream finishes")
        .expect("no error on the old connection")
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "{rest:?}"
    );
    let next = get(data, client, "/echo", &[]).await.unwrap();
    assert_eq!(
        next.serial,
        serial_hex(2),
        "the next connection's certificate"
    );
}
