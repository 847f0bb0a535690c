//! Why probes fail and how often: [`ProbeFailure`] (the reason, with the status or the TLS
//! problem, as logged when a worker flips) and `bch_probe_failures_total{worker,reason}`
//! ([`ProbeFailures`], written by the prober, read at each scrape). What the prober counts is kept
//! apart from how it probes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bch_core::router::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::metrics::{LabelValue, by_worker_and_label, counter};
use crate::per_worker::WorkerKey;
use crate::upstream::TlsProblem;

/// Why a probe failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeFailure {
    /// No TCP connection: refused, unreachable, or the connect timed out.
    Refused,
    /// Connected, but no answer within `[health] timeout_ms`.
    Timeout,
    /// The worker answered with this non-2xx status.
    Status(u16),
    /// The exchange broke, or the probe URI is invalid.
    Error,
    /// An `https://` worker's TLS handshake failed: its certificate is not trusted, expired or
    /// for another name, or it refused ours.
    Tls(TlsProblem),
}

impl ProbeFailure {
    /// The `reason` label.
    pub fn reason(self) -> ProbeReason {
        match self {
            ProbeFailure::Refused => ProbeReason::Refused,
            ProbeFailure::Timeout => ProbeReason::Timeout,
            ProbeFailure::Status(_) => ProbeReason::Status,
            ProbeFailure::Error => ProbeReason::Error,
            ProbeFailure::Tls(_) => ProbeReason::Tls,
        }
    }
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::Status(code) => write!(f, "status {code}"),
            ProbeFailure::Tls(problem) => problem.fmt(f),
            other => f.write_str(other.reason().as_str()),
        }
    }
}

/// The `reason` label of `bch_probe_failures_total`: a [`ProbeFailure`] without its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeReason {
    /// `refused`.
    Refused,
    /// `timeout`.
    Timeout,
    /// `status`.
    Status,
    /// `error`.
    Error,
    /// `tls`.
    Tls,
}

impl LabelValue for ProbeReason {
    const ALL: &'static [Self] = &[
        ProbeReason::Refused,
        ProbeReason::Timeout,
        ProbeReason::Status,
        ProbeReason::Error,
        ProbeReason::Tls,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn as_str(self) -> &'static str {
        match self {
            ProbeReason::Refused => "refused",
            ProbeReason::Timeout => "timeout",
            ProbeReason::Status => "status",
            ProbeReason::Error => "error",
            ProbeReason::Tls => "tls",
        }
    }
}

/// Failed probes of each worker by reason (`bch_probe_failures_total`), written by the prober only
/// under a mutex the data path never touches, and registered by the prober's module. Every worker
/// of the table has a series per reason from the start, at 0; a worker that left is forgotten.
#[derive(Debug, Default)]
pub struct ProbeFailures {
    by_worker: Mutex<BTreeMap<WorkerKey, [u64; ProbeReason::ALL.len()]>>,
}

impl ProbeFailures {
    /// Registers `bch_probe_failures_total` in `registry`, named by the workers of `router`'s
    /// table.
    pub fn register(self: &Arc<Self>, registry: &mut Registry, router: Arc<Router>) {
        registry.register_collector(Box::new(ProbeFailureCollector {
            failures: Arc::clone(self),
            router,
        }));
    }

    /// Counts one failed probe of `worker` for `reason`.
    pub(super) fn record(&self, worker: &WorkerKey, reason: ProbeReason) {
        self.lock().entry(worker.clone()).or_default()[reason.index()] += 1;
    }

    /// Forgets the workers for which `keep` is false (they left the fleet), so churn does not
    /// grow the series forever.
    pub(super) fn retain(&self, keep: impl Fn(&WorkerKey) -> bool) {
        self.lock().retain(|worker, _| keep(worker));
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<WorkerKey, [u64; ProbeReason::ALL.len()]>> {
        self.by_worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct ProbeFailureCollector {
    failures: Arc<ProbeFailures>,
    router: Arc<Router>,
}

impl Collector for ProbeFailureCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let table = self.router.table();
        // Every worker of the table, every reason, from 0: a series that appears only at the first
        // failure leaves rate() and dashboards empty until then.
        let by_worker = self.failures.lock();
        let mut by_name: Vec<(String, [u64; ProbeReason::ALL.len()])> = table
            .workers()
            .iter()
            .map(|worker| {
                let counts = by_worker
                    .get(&WorkerKey::of_worker(worker))
                    .copied()
                    .unwrap_or_default();
                (worker.spec.name.clone(), counts)
            })
            .collect();
        drop(by_worker);
        by_name.sort_unstable();
        counter(
            &mut encoder,
            "bch_probe_failures",
            "Failed health probes by worker and reason (refused, timeout, status, error, tls)",
            by_name.iter().flat_map(|(worker, counts)| {
                by_worker_and_label(worker, "reason", |r: ProbeReason| counts[r.index()])
            }),
        )
    }
}
