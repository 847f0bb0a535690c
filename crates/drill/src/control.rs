//! Client of gatewayd's control plane: the worker table and the routing policy.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

/// One row of `GET /admin/workers`: the gateway's own wire type.
use bch_core::telemetry::WorkerRecord as WorkerStatus;

use crate::tls::{ClientTls, tls_failure};

#[derive(Deserialize)]
struct WorkersBody {
    workers: Vec<WorkerStatus>,
}

/// Whether every worker's in-flight load returned to zero after a drill, by every control plane
/// asked.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrainCheck {
    /// True when every control plane answered and each reported `active == 0` for every worker.
    pub all_zero: bool,
    /// The longest time from the first poll until all were zero (or the wait gave up), in
    /// milliseconds.
    pub waited_ms: f64,
    /// `active` per worker at the last poll, summed over the control planes that answered.
    pub active: BTreeMap<String, u64>,
    /// What each control plane said, in the order given.
    pub replicas: Vec<ReplicaDrain>,
}

impl DrainCheck {
    /// The control planes that could not be asked.
    pub fn unanswered(&self) -> impl Iterator<Item = &ReplicaDrain> {
        self.replicas.iter().filter(|r| r.error.is_some())
    }
}

/// What one control plane said in a drain check.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaDrain {
    /// The control plane's URL.
    pub control: String,
    /// True when it answered and every worker's `active` was 0.
    pub all_zero: bool,
    /// Time from the first poll until all were zero, the wait gave up or the asking failed, in
    /// milliseconds.
    pub waited_ms: f64,
    /// `active` per worker at its last answer (empty when it never answered).
    pub active: BTreeMap<String, u64>,
    /// Why it could not be asked (unreachable, an error status, an unexpected body); `None` when
    /// it answered to the end.
    pub error: Option<String>,
}

/// HTTP client of one gateway's control plane.
#[derive(Clone, Debug)]
pub(crate) struct ControlClient {
    /// The URL as given, for reports.
    url: String,
    /// The URL without a trailing `/`, for joining paths.
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ControlClient {
    /// A client of the control plane at `base` (e.g. `http://127.0.0.1:9090`, or https reached
    /// with `tls`), sending `Authorization: Bearer <token>` when a token is given.
    pub(crate) fn new(base: &Url, token: Option<String>, tls: &ClientTls) -> Self {
        let http = tls
            .http_client()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("a client with ready-made TLS and no proxies always builds");
        Self {
            url: base.as_str().to_owned(),
            base: base.as_str().trim_end_matches('/').to_owned(),
            token,
            http,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<Value> {
        let response = request
            .send()
            .await
            .map_err(|e| match tls_failure(&e) {
                Some(tls) => anyhow::Error::from(e).context(tls),
                None => anyhow::Error::from(e),
            })
            .with_context(|| format!("control plane {} is unreachable", self.base))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .with_context(|| format!("reading {what}"))?;
        if !status.is_success() {
            let mut excerpt = body.chars().take(300).collect::<String>();
            excerpt = excerpt.replace('\n', " ");
            anyhow::bail!("{what} at {} answered {status}: {excerpt}", self.base);
        }
        serde_json::from_str(&body).with_context(|| format!("{what} answered invalid JSON"))
    }

    /// `GET /admin/workers`.
    pub(crate) async fn workers(&self) -> anyhow::Result<Vec<WorkerStatus>> {
        let value = self
            .send(
                self.request(reqwest::Method::GET, "/admin/workers"),
                "GET /admin/workers",
            )
            .await?;
        let body: WorkersBody = serde_json::from_value(value)
            .context("GET /admin/workers answered an unexpected shape")?;
        Ok(body.workers)
    }

    /// `GET /admin/policy`: the policy in force, as the gateway reports it.
    pub(crate) async fn policy(&self) -> anyhow::Result<Value> {
        self.send(
            self.request(reqwest::Method::GET, "/admin/policy"),
            "GET /admin/policy",
        )
        .await
    }

    /// `PUT /admin/policy` with `body` as it is (a policy patch, with `admission` beside its
    /// fields); answers the resulting policy as the gateway reports it.
    pub(crate) async fn put_policy(&self, body: &Value) -> anyhow::Result<Value> {
        let request = self
            .request(reqwest::Method::PUT, "/admin/policy")
            .json(body);
        self.send(request, "PUT /admin/policy").await
    }

    /// [`ControlClient::wait_drained`] on every replica's control plane at once: drained when all
    /// answered and all are, `active` summed per worker name over those that answered, the
    /// longest wait. One control plane that cannot be asked is named in the check (a finding of
    /// a drill that kills a replica), never an error that loses the others' answers.
    pub(crate) async fn wait_all_drained(
        clients: &[ControlClient],
        within: Duration,
    ) -> DrainCheck {
        let replicas =
            futures_util::future::join_all(clients.iter().map(|c| c.wait_drained(within))).await;
        let mut merged = DrainCheck {
            all_zero: true,
            waited_ms: 0.0,
            active: BTreeMap::new(),
            replicas: Vec::with_capacity(replicas.len()),
        };
        for replica in replicas {
            merged.all_zero &= replica.all_zero;
            merged.waited_ms = merged.waited_ms.max(replica.waited_ms);
            for (worker, active) in &replica.active {
                *merged.active.entry(worker.clone()).or_default() += active;
            }
            merged.replicas.push(replica);
        }
        merged
    }

    /// Polls `GET /admin/workers` until every worker's `active` is 0, for at most `within`; a
    /// failed poll ends the wait with the failure in [`ReplicaDrain::error`].
    ///
    /// Polling, not a single read: the gateway drops a request's load guard just after the last byte
    /// reaches the client, so a read right after the storm may still see the last few requests.
    pub(crate) async fn wait_drained(&self, within: Duration) -> ReplicaDrain {
        let start = Instant::now();
        let mut poll = tokio::time::interval(Duration::from_millis(20));
        let mut drain = ReplicaDrain {
            control: self.url.clone(),
            all_zero: false,
            waited_ms: 0.0,
            active: BTreeMap::new(),
            error: None,
        };
        loop {
            poll.tick().await;
            let workers = self.workers().await;
            drain.waited_ms = start.elapsed().as_secs_f64() * 1000.0;
            match workers {
                Ok(workers) => {
                    drain.all_zero = workers.iter().all(|w| w.active == 0);
                    drain.active = workers.into_iter().map(|w| (w.name, w.active)).collect();
                    if drain.all_zero || start.elapsed() >= within {
                        return drain;
                    }
                }
                Err(e) => {
                    drain.all_zero = false;
                    drain.error = Some(format!("{e:#}"));
                    return drain;
                }
            }
        }
    }
}
