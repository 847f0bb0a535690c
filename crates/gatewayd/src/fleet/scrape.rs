//! One scrape of one worker: `GET {url}{metrics_path}` with a deadline below the scrape interval
//! and a cap on the body, then the load out of the text. Every way it can go wrong is a
//! [`Failure`], never a panic.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::gauges::{GaugeError, Reading, read_load};

/// The client scrapes go through: plain HTTP, keep-alive connections pooled per worker.
pub type ScrapeClient = Client<HttpConnector, Empty<Bytes>>;

/// Why a scrape gave no load. `reason()` is the metrics label.
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
    /// The body is not UTF-8 text.
    #[error("the metrics body is not UTF-8 text")]
    NotText,
    /// The text holds no usable load gauge.
    #[error("{0}")]
    Gauges(#[from] GaugeError),
}

impl Failure {
    /// Every label [`Failure::reason`] gives, for metrics pre-registration.
    pub const REASONS: [&'static str; 9] = [
        "bad_uri",
        "unreachable",
        "timeout",
        "http_status",
        "too_large",
        "not_text",
        "no_gauges",
        "unparsable",
        "bad_value",
    ];

    /// The failure's metrics label, one of [`Failure::REASONS`].
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::BadUri => "bad_uri",
            Failure::Unreachable => "unreachable",
            Failure::Timeout => "timeout",
            Failure::Status(_) => "http_status",
            Failure::TooLarge => "too_large",
            Failure::NotText => "not_text",
            Failure::Gauges(GaugeError::NoGauges) => "no_gauges",
            Failure::Gauges(GaugeError::Unparsable) => "unparsable",
            Failure::Gauges(GaugeError::BadValue) => "bad_value",
        }
    }

    /// Index of [`Failure::reason`] in [`Failure::REASONS`].
    pub fn index(&self) -> usize {
        Failure::REASONS
            .iter()
            .position(|r| *r == self.reason())
            .unwrap_or(0)
    }
}

/// Scrapes `uri` once: the whole answer within `timeout`, at most `max_bytes` of body, then the
/// load of the recognised gauges (the configured pair `custom` first).
pub async fn scrape(
    client: &ScrapeClient,
    uri: Option<&Uri>,
    timeout: Duration,
    max_bytes: usize,
    custom: Option<(&str, &str)>,
) -> Result<Reading, Failure> {
    let uri = uri.ok_or(Failure::BadUri)?;
    let body = tokio::time::timeout(timeout, fetch(client, uri, max_bytes))
        .await
        .unwrap_or(Err(Failure::Timeout))?;
    let text = std::str::from_utf8(&body).map_err(|_| Failure::NotText)?;
    Ok(read_load(text, custom)?)
}

async fn fetch(client: &ScrapeClient, uri: &Uri, max_bytes: usize) -> Result<Bytes, Failure> {
    let request = Request::get(uri.clone())
        // The classic text format; engines that negotiate would otherwise be free to answer
        // protobuf.
        .header(header::ACCEPT, "text/plain;version=0.0.4;q=1, */*;q=0.1")
        .body(Empty::new())
        .map_err(|_| Failure::BadUri)?;
    let response = client
        .request(request)
        .await
        .map_err(|_| Failure::Unreachable)?;
    if !response.status().is_success() {
        return Err(Failure::Status(response.status().as_u16()));
    }
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(Failure::TooLarge);
    }
    let collected = Limited::new(response.into_body(), max_bytes)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<LengthLimitError>() {
                Failure::TooLarge
            } else {
                Failure::Unreachable
            }
        })?;
    Ok(collected.to_bytes())
}
