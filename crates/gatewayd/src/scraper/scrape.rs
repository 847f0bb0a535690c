//! One scrape of one worker: `GET {url}{metrics_path}` over the worker's own keep-alive
//! connection, with a cap on the body, then the load out of the text. Every way it can go wrong is
//! a [`Failure`], never a panic; the round's deadline is the caller's (dropping a scrape drops its
//! connection, so a late answer can never be read as the next round's).
//!
//! hyper's HTTP/1 client connection, not a pooled client: a scraper has exactly one connection
//! per worker and one request on it at a time, so a pool's checkout, its per-connection task and
//! the channel between them were most of a scrape's user-space cost. The connection is driven by
//! the scrape that uses it, in the scraper's own task.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::Poll;

use bytes::Bytes;
use http::uri::Scheme;
use http::{HeaderValue, Request, Uri, header};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::gauges::{GaugeError, Reading, read_load};
use crate::metrics::LabelValue;
use crate::upstream::tls::WorkerStream;
use crate::upstream::{TlsProblem, WorkerTls, tls_problem};

/// Where and what to ask: a worker's metrics URI split for an HTTP/1.1 request.
#[derive(Debug, Clone)]
pub struct Target {
    host: String,
    port: u16,
    /// Origin form (`/metrics`), as HTTP/1.1 servers expect it.
    request_uri: Uri,
    authority: HeaderValue,
    /// For an `https://` worker, the name its certificate is checked against; `None`: plain HTTP.
    server_name: Option<ServerName<'static>>,
}

impl Target {
    /// The target of an absolute `http://` or `https://` URI (an https one checked against
    /// `server_name`); `None` for any other scheme, an https URI without a server name or a URI
    /// without a host (the scrape then fails as [`Failure::BadUri`]).
    pub fn new(uri: &Uri, server_name: Option<ServerName<'static>>) -> Option<Target> {
        let server_name = match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => None,
            Some(scheme) if *scheme == Scheme::HTTPS => Some(server_name?),
            _ => return None,
        };
        let default_port = if server_name.is_some() { 443 } else { 80 };
        let authority = uri.authority()?;
        let request_uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .ok()?;
        Some(Target {
            // `[::1]` in a URI is `::1` to the resolver.
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(default_port),
            request_uri,
            authority: HeaderValue::from_str(authority.as_str()).ok()?,
            server_name,
        })
    }
}

/// A kept-alive HTTP/1.1 connection to one worker.
pub struct Connection {
    sender: http1::SendRequest<Empty<Bytes>>,
    driver: Driver,
}

/// The half of a connection that reads and writes the socket.
type Driver = http1::Connection<TokioIo<WorkerStream>, Empty<Bytes>>;

/// How a new connection is opened: TLS toward `https://` workers, and the handshake's limit.
#[derive(Clone, Copy)]
pub struct Opener<'a> {
    /// The data plane's TLS toward workers.
    pub tls: &'a WorkerTls,
    /// How long a TLS handshake may take.
    pub handshake_timeout: std::time::Duration,
}

impl Connection {
    async fn open(target: &Target, open: Opener<'_>) -> Result<Connection, Failure> {
        let stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|_| Failure::Unreachable)?;
        // One small request per round: waiting to coalesce it would only delay the answer.
        let _ = stream.set_nodelay(true);
        let stream = match &target.server_name {
            None => WorkerStream::Plain(stream),
            Some(name) => open
                .tls
                .handshake(stream, name.clone(), open.handshake_timeout)
                .await
                .map_err(|error| {
                    Failure::Tls(tls_problem(&*error).unwrap_or(TlsProblem::Handshake))
                })?,
        };
        let (sender, driver) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|_| Failure::Unreachable)?;
        Ok(Connection { sender, driver })
    }

    /// Whether the connection can carry another request: the worker has not closed it since the
    /// last scrape (hyper reads the close when the idle connection is polled).
    async fn is_open(&mut self) -> bool {
        let driver = &mut self.driver;
        let ended = poll_fn(|cx| Poll::Ready(Pin::new(&mut *driver).poll(cx).is_ready())).await;
        !ended && !self.sender.is_closed()
    }
}

/// Runs `future` while driving the connection's reads and writes; `Unreachable` when the
/// connection ends before `future` is done.
async fn drive<F: Future>(driver: &mut Driver, future: F) -> Result<F::Output, Failure> {
    let mut future = pin!(future);
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match Pin::new(&mut *driver).poll(cx) {
            Poll::Pending => Poll::Pending,
            // What the connection delivered before it ended is in `future` now.
            Poll::Ready(_) => Poll::Ready(match future.as_mut().poll(cx) {
                Poll::Ready(output) => Ok(output),
                Poll::Pending => Err(Failure::Unreachable),
            }),
        }
    })
    .await
}

/// Why a scrape gave no load. [`Failure::reason`] is the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The worker's URL and metrics path make no valid URI.
    #[error("the metrics URI is invalid")]
    BadUri,
    /// No connection, or it broke before the whole answer arrived.
    #[error("unreachable")]
    Unreachable,
    /// No whole answer within the scrape timeout.
    #[error("timed out")]
    Timeout,
    /// A status other than 2xx.
    #[error("answered HTTP {0}")]
    Status(u16),
    /// The body exceeded `[load] max_scrape_bytes`.
    #[error("the metrics body exceeds max_scrape_bytes")]
    TooLarge,
    /// The answer is not HTTP/1.1 (a status line or headers that do not parse: a TLS or gRPC
    /// port, another protocol).
    #[error("the answer is not HTTP/1.1")]
    BadResponse,
    /// The body is not UTF-8 text.
    #[error("the metrics body is not UTF-8 text")]
    NotText,
    /// The text holds no usable load gauge.
    #[error("{0}")]
    Gauges(#[from] GaugeError),
    /// An `https://` worker's TLS handshake failed (its certificate, or it refused ours).
    #[error("{0}")]
    Tls(TlsProblem),
}

impl Failure {
    /// The failure's metrics label.
    pub fn reason(&self) -> ScrapeReason {
        match self {
            Failure::BadUri => ScrapeReason::BadUri,
            Failure::Unreachable => ScrapeReason::Unreachable,
            Failure::Timeout => ScrapeReason::Timeout,
            Failure::Status(_) => ScrapeReason::HttpStatus,
            Failure::BadResponse => ScrapeReason::BadResponse,
            Failure::TooLarge => ScrapeReason::TooLarge,
            Failure::NotText => ScrapeReason::NotText,
            Failure::Gauges(GaugeError::NoGauges) => ScrapeReason::NoGauges,
            Failure::Gauges(GaugeError::Unparsable) => ScrapeReason::Unparsable,
            Failure::Gauges(GaugeError::BadValue) => ScrapeReason::BadValue,
            Failure::Tls(_) => ScrapeReason::Tls,
        }
    }
}

/// The `reason` label of `bch_load_scrape_failures_total`: a [`Failure`] without its details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScrapeReason {
    /// `bad_uri`.
    BadUri,
    /// `unreachable`.
    Unreachable,
    /// `timeout`.
    Timeout,
    /// `http_status`.
    HttpStatus,
    /// `bad_response`.
    BadResponse,
    /// `too_large`.
    TooLarge,
    /// `not_text`.
    NotText,
    /// `no_gauges`.
    NoGauges,
    /// `unparsable`.
    Unparsable,
    /// `bad_value`.
    BadValue,
    /// `tls`.
    Tls,
}

impl LabelValue for ScrapeReason {
    const ALL: &'static [Self] = &[
        ScrapeReason::BadUri,
        ScrapeReason::Unreachable,
        ScrapeReason::Timeout,
        ScrapeReason::HttpStatus,
        ScrapeReason::BadResponse,
        ScrapeReason::TooLarge,
        ScrapeReason::NotText,
        ScrapeReason::NoGauges,
        ScrapeReason::Unparsable,
        ScrapeReason::BadValue,
        ScrapeReason::Tls,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn as_str(self) -> &'static str {
        match self {
            ScrapeReason::BadUri => "bad_uri",
            ScrapeReason::Unreachable => "unreachable",
            ScrapeReason::Timeout => "timeout",
            ScrapeReason::HttpStatus => "http_status",
            ScrapeReason::BadResponse => "bad_response",
            ScrapeReason::TooLarge => "too_large",
            ScrapeReason::NotText => "not_text",
            ScrapeReason::NoGauges => "no_gauges",
            ScrapeReason::Unparsable => "unparsable",
            ScrapeReason::BadValue => "bad_value",
            ScrapeReason::Tls => "tls",
        }
    }
}

/// Scrapes `target` once, on `reuse` when it is still open (else on a new connection): the
/// whole answer, at most `max_bytes` of body, then the load of the recognised gauges (the
/// configured pair `custom` first). Answers the connection when it can carry the next scrape.
pub async fn scrape(
    target: Option<&Target>,
    reuse: Option<Connection>,
    open: Opener<'_>,
    max_bytes: usize,
    custom: Option<(&str, &str)>,
) -> (Result<Reading, Failure>, Option<Connection>) {
    let Some(target) = target else {
        return (Err(Failure::BadUri), None);
    };
    let reused = match reuse {
        Some(mut connection) => connection.is_open().await.then_some(connection),
        None => None,
    };
    let (outcome, connection) = match reused {
        Some(mut connection) => match exchange(&mut connection, target, max_bytes).await {
            // A worker may close an idle connection just as the request goes out; that is no
            // reason to count the worker unreachable, so one more try on a fresh connection.
            // Only then: a reused connection that breaks mid-answer is a failed scrape.
            Exchange::NoAnswer => exchange_fresh(target, open, max_bytes).await,
            outcome => (outcome, Some(connection)),
        },
        None => exchange_fresh(target, open, max_bytes).await,
    };
    let (body, reusable) = match outcome {
        Exchange::Body(body) => (Ok(body), true),
        Exchange::Answered(failure) => (Err(failure), true),
        Exchange::Broken(failure) => (Err(failure), false),
        Exchange::NoAnswer => (Err(Failure::Unreachable), false),
    };
    let connection = connection.filter(|c| reusable && !c.sender.is_closed());
    let reading = body.and_then(|body| {
        let text = std::str::from_utf8(&body).map_err(|_| Failure::NotText)?;
        Ok(read_load(text, custom)?)
    });
    (reading, connection)
}

/// How one request on a connection ended.
enum Exchange {
    /// The whole 2xx body; the connection can carry the next scrape.
    Body(Bytes),
    /// A failure after a whole answer was read (a non-2xx status): the connection can carry the
    /// next scrape, so a worker without metrics does not cost a new connection every round.
    Answered(Failure),
    /// A failure that leaves the connection unusable: mid-answer, over the cap, not HTTP.
    Broken(Failure),
    /// No answer at all: the connection ended or failed before a response head arrived.
    NoAnswer,
}

async fn exchange_fresh(
    target: &Target,
    open: Opener<'_>,
    max_bytes: usize,
) -> (Exchange, Option<Connection>) {
    match Connection::open(target, open).await {
        Ok(mut connection) => {
            let outcome = exchange(&mut connection, target, max_bytes).await;
            (outcome, Some(connection))
        }
        Err(failure) => (Exchange::Broken(failure), None),
    }
}

/// What a hyper error before the response head means: a TLS refusal, not HTTP at all (a TLS or
/// gRPC port, a status line that does not parse), or no answer.
fn before_answer(error: &hyper::Error) -> Exchange {
    // TLS 1.3 tells a client the worker refused its certificate on the first read.
    if let Some(problem) = tls_problem(error) {
        Exchange::Broken(Failure::Tls(problem))
    } else if error.is_parse() || error.is_parse_status() || error.is_parse_too_large() {
        Exchange::Broken(Failure::BadResponse)
    } else {
        Exchange::NoAnswer
    }
}

async fn exchange(connection: &mut Connection, target: &Target, max_bytes: usize) -> Exchange {
    let request = match Request::get(target.request_uri.clone())
        .header(header::HOST, target.authority.clone())
        // The classic text format; engines that negotiate would otherwise be free to answer
        // protobuf.
        .header(header::ACCEPT, "text/plain;version=0.0.4;q=1, */*;q=0.1")
        .header(header::USER_AGENT, USER_AGENT)
        .body(Empty::new())
    {
        Ok(request) => request,
        Err(_) => return Exchange::Broken(Failure::BadUri),
    };
    let Connection { sender, driver } = connection;
    match drive(driver, poll_fn(|cx| sender.poll_ready(cx))).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return before_answer(&error),
        Err(_) => return Exchange::NoAnswer,
    }
    let response = match drive(driver, sender.send_request(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return before_answer(&error),
        Err(_) => return Exchange::NoAnswer,
    };
    let status = response.status();
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Exchange::Broken(match status.is_success() {
            true => Failure::TooLarge,
            false => Failure::Status(status.as_u16()),
        });
    }
    let collect = Limited::new(response.into_body(), max_bytes).collect();
    let body = match drive(driver, collect).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if status.is_success() && error.is::<LengthLimitError>() => {
            return Exchange::Broken(Failure::TooLarge);
        }
        // The answer broke off (or a non-2xx body overran the cap): the status, if there was
        // one to report, else unreachable.
        Ok(Err(_)) | Err(_) if !status.is_success() => {
            return Exchange::Broken(Failure::Status(status.as_u16()));
        }
        Ok(Err(_)) | Err(_) => return Exchange::Broken(Failure::Unreachable),
    };
    match status.is_success() {
        true => Exchange::Body(body),
        false => Exchange::Answered(Failure::Status(status.as_u16())),
    }
}

/// The scraper's `User-Agent`, so a worker's access log says who asks for `/metrics` ten times a
/// second.
const USER_AGENT: &str = concat!("bch-gatewayd/", env!("CARGO_PKG_VERSION"), " load-scraper");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_slot_and_its_label() {
        let labels: Vec<&str> = ScrapeReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            labels,
            [
                "bad_uri",
                "unreachable",
                "timeout",
                "http_status",
                "bad_response",
                "too_large",
                "not_text",
                "no_gauges",
                "unparsable",
                "bad_value",
                "tls",
            ]
        );
        for (index, reason) in ScrapeReason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), index);
        }
        assert_eq!(Failure::Status(503).reason(), ScrapeReason::HttpStatus);
        assert_eq!(
            Failure::Gauges(GaugeError::BadValue).reason(),
            ScrapeReason::BadValue
        );
    }
}
