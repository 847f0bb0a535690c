//! TLS on gatewayd's listeners, with certificates made here by rcgen (a CA, server and client
//! certificates it signs, and a rogue CA's), real rustls clients that always verify, and the
//! gateway started in-process: the data plane, the control plane and `/ws`, the picker over h2,
//! mutual TLS accepted and refused, plain HTTP and stalled handshakes, rotation by reload and by
//! SIGHUP on the daemon, and `check-config`'s findings.

#[path = "../common/mod.rs"]
mod common;

mod checks;
mod clients;
mod listeners;
mod rotation;
mod signals;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bch_tls::test_pki::{self, Authority, rcgen};
use bytes::Bytes;
use gatewayd::config::ListenerTls;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A leaf for `localhost` and 127.0.0.1 signed by `authority`, with `serial`, valid until
/// `not_after` (Unix seconds; `None` = far future): (certificate PEM, key PEM).
pub fn leaf(authority: &Authority, serial: u64, not_after: Option<u64>) -> (String, String) {
    let signed = authority.sign(&["localhost", "127.0.0.1"], |params| {
        params.serial_number = Some(serial.into());
        if let Some(not_after) = not_after {
            let epoch = rcgen::date_time_ymd(1970, 1, 1);
            params.not_after = epoch + Duration::from_secs(not_after);
            params.not_before = epoch + Duration::from_secs(not_after.saturating_sub(30 * 86_400));
        }
    });
    (signed.cert, signed.key)
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The test's certificates on disk: a CA (`ca.crt`) with a server certificate (serial 1) and a
/// client certificate, and a rogue CA with its own client certificate.
pub struct Pki {
    /// The files (removed on drop) and the CA the gateway trusts for client certificates, and the
    /// clients for the server's.
    files: test_pki::Pki,
    /// A CA nobody trusts.
    pub rogue: Authority,
}

impl Pki {
    /// Makes the authorities and writes every file.
    pub fn generate() -> Pki {
        let pki = Pki {
            files: test_pki::Pki::new("bch test CA"),
            rogue: Authority::new("rogue CA"),
        };
        pki.write_server(&leaf(pki.ca(), 1, None));
        let (cert, key) = leaf(pki.ca(), 100, None);
        pki.write("client.crt", &cert);
        pki.write("client.key", &key);
        let (cert, key) = leaf(&pki.rogue, 200, None);
        pki.write("rogue.crt", &cert);
        pki.write("rogue.key", &key);
        pki
    }

    /// The CA the gateway and the clients trust.
    pub fn ca(&self) -> &Authority {
        self.files.ca()
    }

    /// The file called `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.files.path(name)
    }

    /// Writes the file called `name` (whole, then renamed: a reader never sees half a file).
    pub fn write(&self, name: &str, text: &str) {
        self.files.write(name, text);
    }

    /// Replaces the served certificate and key files.
    pub fn write_server(&self, (cert, key): &(String, String)) {
        self.write("server.crt", cert);
        self.write("server.key", key);
    }

    /// `[*.tls]` serving `server.crt`; with mutual TLS from the CA when `mutual`.
    pub fn listener(&self, mutual: bool) -> ListenerTls {
        ListenerTls {
            cert_file: self.path("server.crt"),
            key_file: self.path("server.key"),
            client_ca_file: if mutual {
                self.path("ca.crt")
            } else {
                PathBuf::new()
            },
        }
    }

    /// A verifying client trusting the CA, presenting `identity` (`"client"`, `"rogue"`) if
    /// given, offering `alpn`.
    pub fn client(&self, identity: Option<&str>, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let files = identity.map(|name| {
            (
                self.path(&format!("{name}.crt")),
                self.path(&format!("{name}.key")),
            )
        });
        let tls = bch_tls::ClientTls::from_files(
            Some(&self.path("ca.crt")),
            files.as_ref().map(|(cert, _)| cert.as_path()),
            files.as_ref().map(|(_, key)| key.as_path()),
        )
        .unwrap();
        let mut config = rustls::ClientConfig::clone(&tls.config());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// A TLS connection to `addr` as `localhost`, verified against the client's roots.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The serial number (hex) of the certificate the server presented on `stream`.
pub fn served_serial(stream: &TlsStream<TcpStream>) -> String {
    let (_, session) = stream.get_ref();
    let leaf = &session.peer_certificates().expect("server certificate")[0];
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref()).unwrap();
    parsed.raw_serial_as_string()
}

/// The serial rcgen writes for `serial` (as [`served_serial`] reads it).
pub fn serial_hex(serial: u64) -> String {
    let bytes = serial.to_be_bytes();
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(7);
    bytes[first..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// An answer read by [`get`]: status, body, and the serial of the certificate served.
pub struct Answer {
    /// The response's status.
    pub status: u16,
    /// The response's body.
    pub body: String,
    /// The served certificate's serial, hex.
    pub serial: String,
    /// The protocol ALPN settled on.
    pub alpn: Option<Vec<u8>>,
}

/// `GET path` on a new TLS connection to `addr`, headers `headers`.
pub async fn get(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    let stream = connect(addr, config).await?;
    let serial = served_serial(&stream);
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    let mut request = http::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .map_err(std::io::Error::other)?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        serial,
        alpn,
    })
}

/// The value of the series `name{labels}` in a `/metrics` text, if shown.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Waits (bounded) until every worker's in-flight load is back to 0; whether it was.
pub async fn all_idle(gateway: &gatewayd::RunningGateway) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let records = gateway.routing_table().worker_records(0);
        if records.iter().all(|record| record.active == 0) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        // Loads drop when the gateway notices a stream's end; poll at a short interval.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The served certificate's path, for messages.
pub fn shown(path: &Path) -> String {
    path.display().to_string()
}
