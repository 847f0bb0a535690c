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

use bytes::Bytes;
use gatewayd::config::ListenerTls;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A certificate authority that signs server and client certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub pem: String,
}

impl Authority {
    /// A new CA called `name`, with its own key.
    pub fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Authority {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A leaf for `localhost` and 127.0.0.1 with `serial`, valid until `not_after` (Unix
    /// seconds; `None` = far future): (certificate PEM, key PEM).
    pub fn leaf(&self, serial: u64, not_after: Option<u64>) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.serial_number = Some(serial.into());
        if let Some(not_after) = not_after {
            let epoch = rcgen::date_time_ymd(1970, 1, 1);
            params.not_after = epoch + Duration::from_secs(not_after);
            params.not_before = epoch + Duration::from_secs(not_after.saturating_sub(30 * 86_400));
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The test's certificates on disk: a CA with a server certificate (serial 1) and a client
/// certificate, and a rogue CA with its own client certificate.
pub struct Pki {
    /// Where the files are (removed on drop).
    pub dir: tempfile::TempDir,
    /// The CA the gateway trusts for client certificates, and the clients for the server's.
    pub ca: Authority,
    /// A CA nobody trusts.
    pub rogue: Authority,
}

impl Pki {
    /// Makes the authorities and writes every file.
    pub fn generate() -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
            ca: Authority::new("bch test CA"),
            rogue: Authority::new("rogue CA"),
        };
        pki.write("ca.crt", &pki.ca.pem);
        pki.write_server(&pki.ca.leaf(1, None));
        let (cert, key) = pki.ca.leaf(100, None);
        pki.write("client.crt", &cert);
        pki.write("client.key", &key);
        let (cert, key) = pki.rogue.leaf(200, None);
        pki.write("rogue.crt", &cert);
        pki.write("rogue.key", &key);
        pki
    }

    /// The file called `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the file called `name`.
    pub fn write(&self, name: &str, text: &str) {
        // Written whole then renamed, as cert-manager's atomic writer does: a reader never sees
        // half a file.
        let temporary = self.path(&format!("{name}.new"));
        std::fs::write(&temporary, text).unwrap();
        std::fs::rename(temporary, self.path(name)).unwrap();
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
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.path("ca.crt")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(name) => {
                let chain = CertificateDer::pem_file_iter(self.path(&format!("{name}.crt")))
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                let key = PrivateKeyDer::from_pem_file(self.path(&format!("{name}.key"))).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
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
