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

#[derive(Deserialize)]
struct WorkersBody {
    workers: Vec<WorkerStatus>,
}

use bch_core::policy::PolicyPatch;

/// Whether every worker's in-flight load returned to zero after a drill.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrainCheck {
    /// True when every worker reported `active == 0`.
    pub all_zero: bool,
    /// Time from the first poll until all were zero (or the wait gave up), in milliseconds.
    pub waited_ms: f64,
    /// `active` per worker at the last poll.
    pub active: BTreeMap<String, u64>,
}

/// HTTP client of one gateway's control plane.
#[derive(Clone, Debug)]
pub(crate) struct ControlClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ControlClient {
    /// A client of the control plane at `base` (e.g. `http://127.0.0.1:9090`), sending
    /// `Authorization: Bearer <token>` when a token is given.
    pub(crate) fn new(base: &Url, token: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("a client without TLS or proxies always builds");
        Self {
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

    /// `PUT /admin/policy`; answers the resulting policy as the gateway reports it.
    pub(crate) async fn set_policy(&self, patch: &PolicyPatch) -> anyhow::Result<Value> {
        let request = self
            .request(reqwest::Method::PUT, "/admin/policy")
            .json(patch);
        self.send(request, "PUT /admin/policy").await
    }

    /// [`ControlClient::wait_drained`] on every replica's control plane at once: drained when all
    /// are, `active` summed per worker name over the replicas, the longest wait.
    pub(crate) async fn wait_all_drained(
        clients: &[ControlClient],
        within: Duration,
    ) -> anyhow::Result<DrainCheck> {
        let checks =
            futures_util::future::try_join_all(clients.iter().map(|c| c.wait_drained(within)))
                .await?;
        let mut merged = DrainCheck {
            all_zero: true,
            waited_ms: 0.0,
            active: BTreeMap::new(),
        };
        for check in checks {
            merged.all_zero &= check.all_zero;
            merged.waited_ms = merged.waited_ms.max(check.waited_ms);
            for (worker, active) in check.active {
                *merged.active.entry(worker).or_default() += active;
            }
        }
        Ok(merged)
    }

    /// Polls `GET /admin/workers` until every worker's `active` is 0, for at most `within`.
    ///
    /// Polling, not a single read: the gateway drops a request's load guard just after the last byte
    /// reaches the client, so a read right after the storm may still see the last few requests.
    pub(crate) async fn wait_drained(&self, within: Duration) -> anyhow::Result<DrainCheck> {
        let start = Instant::now();
        let mut poll = tokio::time::interval(Duration::from_millis(20));
        loop {
            poll.tick().await;
            let workers = self.workers().await?;
            let all_zero = workers.iter().all(|w| w.active == 0);
            if all_zero || start.elapsed() >= within {
                return Ok(DrainCheck {
                    all_zero,
                    waited_ms: start.elapsed().as_secs_f64() * 1000.0,
                    active: workers.into_iter().map(|w| (w.name, w.active)).collect(),
                });
            }
        }
    }
}
