//! Prometheus metrics (`GET /metrics` on the control plane), all prefixed `bch_`.
//!
//! Per-worker values are not kept in metric families: they are read from the router's atomic
//! counters at scrape time by a collector (responses by status class and durations too, from
//! bch-core's lock-free per-worker histogram), so the data path pays nothing for them and a removed
//! worker simply disappears from the next scrape. Branch counts are plain atomics for the same
//! reason; only the fleet-wide latency histograms take prometheus-client's short internal lock.
//! Probe failures are written by the prober only, under a mutex the data path never touches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bch_core::fleet_load::LoadSource;
use bch_core::load::{DurationHistogram, StatusClass};
use bch_core::policy::{Branch, PolicyKind, SpillOrder};
use bch_core::router::Router;
use bch_core::routing_key::IgnoredKey;
use bch_core::telemetry::WorkerState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::encoding::{MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::health::ProbeReason;
use crate::per_worker::WorkerKey;
use crate::scraper::{ScrapeReason, ScrapeStats};

/// The `reason` labels of `bch_client_body_errors_total`: a request body that ended early (the
/// client left), was malformed, went over `max_body_bytes`, or came too slowly.
pub const CLIENT_BODY_ERROR_REASONS: [&str; 4] =
    ["incomplete", "malformed", "too_large", "timeout"];

/// A label with a fixed set of values: `ALL[value.index()] == value`, so a family's counters are
/// an array indexed by value. The one pattern of every labelled counter here.
pub trait LabelValue: Copy + 'static {
    /// Every value, in the order the series are shown.
    const ALL: &'static [Self];

    /// Position in [`LabelValue::ALL`].
    fn index(self) -> usize;

    /// The label value on `/metrics`.
    fn as_str(self) -> &'static str;
}

impl LabelValue for Branch {
    const ALL: &'static [Self] = &Branch::ALL;

    fn index(self) -> usize {
        Branch::ALL.iter().position(|b| *b == self).unwrap_or(0)
    }

    fn as_str(self) -> &'static str {
        Branch::as_str(self)
    }
}

impl LabelValue for IgnoredKey {
    const ALL: &'static [Self] = &IgnoredKey::ALL;

    fn index(self) -> usize {
        IgnoredKey::index(self)
    }

    fn as_str(self) -> &'static str {
        IgnoredKey::as_str(self)
    }
}

impl LabelValue for StatusClass {
    const ALL: &'static [Self] = &StatusClass::ALL;

    fn index(self) -> usize {
        StatusClass::index(self)
    }

    fn as_str(self) -> &'static str {
        StatusClass::as_str(self)
    }
}

/// One row per value of `L` (label `name`), with `count(value)`.
pub fn by_label<L: LabelValue>(
    name: &'static str,
    count: impl Fn(L) -> u64,
) -> impl Iterator<Item = (Vec<(&'static str, String)>, u64)> {
    L::ALL
        .iter()
        .map(move |value| (vec![(name, value.as_str().to_owned())], count(*value)))
}

/// Data-path metrics. Cheap to update: atomics, plus one histogram observation per response.
#[derive(Debug)]
pub struct Metrics {
    branches: [AtomicU64; Branch::ALL.len()],
    ignored_keys: [AtomicU64; IgnoredKey::ALL.len()],
    client_body_errors: [AtomicU64; CLIENT_BODY_ERROR_REASONS.len()],
    retries: AtomicU64,
    rejected_connections: AtomicU64,
    telemetry_dropped: AtomicU64,
    /// Responses of requests that never got a worker (413, 503), by status class.
    unrouted_responses: [AtomicU64; StatusClass::ALL.len()],
    /// Failed probes of each worker, indexed by [`ProbeReason`]; written by the prober only.
    probe_failures: Mutex<BTreeMap<WorkerKey, [u64; ProbeReason::ALL.len()]>>,
    /// Whole request duration, seconds (until the last body byte or the client left).
    pub request_duration: Histogram,
    /// Time until the worker's response headers arrived, seconds. Engines send headers before
    /// prefill, so this is not the time to the first token.
    pub response_headers: Histogram,
    /// Event streams: time until the first data chunk of the body reached the gateway, seconds.
    /// For an LLM stream that is the first token (the prefill's end).
    pub time_to_first_token: Histogram,
    /// DNS discovery's counters, per source (never touched by the data path).
    pub discovery: Arc<DiscoveryMetrics>,
}

/// Counters of one discovery source.
#[derive(Debug, Default)]
pub struct SourceCounters {
    refreshes: AtomicU64,
    errors: AtomicU64,
    skipped_records: AtomicU64,
}

impl SourceCounters {
    /// Counts one finished resolution, whatever its outcome.
    pub fn record_refresh(&self) {
        self.refreshes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed resolution (resolver error, timeout, SERVFAIL or another error code).
    pub fn record_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Records how many records the last answer had that could not be used.
    pub fn set_skipped_records(&self, count: usize) {
        self.skipped_records.store(count as u64, Ordering::Relaxed);
    }
}

/// Every discovery source's counters by source label (`dns:NAME`). A source's counters live as
/// long as the process, across reloads, so its counts stay monotonic.
#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    sources: Mutex<BTreeMap<String, Arc<SourceCounters>>>,
}

impl DiscoveryMetrics {
    /// The counters of the source labelled `label`, created on first use.
    pub fn source(&self, label: &str) -> Arc<SourceCounters> {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(sources.entry(label.to_owned()).or_default())
    }

    fn snapshot(&self) -> Vec<(String, Arc<SourceCounters>)> {
        let sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        sources
            .iter()
            .map(|(label, counters)| (label.clone(), Arc::clone(counters)))
            .collect()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            branches: Default::default(),
            ignored_keys: Default::default(),
            client_body_errors: Default::default(),
            retries: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            telemetry_dropped: AtomicU64::new(0),
            unrouted_responses: Default::default(),
            probe_failures: Mutex::new(BTreeMap::new()),
            // 1 ms .. ~16 min: LLM requests range from instant cache hits to long generations.
            request_duration: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            response_headers: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            time_to_first_token: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            discovery: Arc::default(),
        }
    }
}

impl Metrics {
    /// Counts one routing decision.
    pub fn record_branch(&self, branch: Branch) {
        self.branches[LabelValue::index(branch)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an explicit routing key header that was ignored.
    pub fn record_ignored_key(&self, reason: IgnoredKey) {
        self.ignored_keys[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request body that failed on the client's side, by `reason` (one of
    /// [`CLIENT_BODY_ERROR_REASONS`]; others are not counted).
    pub fn record_client_body_error(&self, reason: &str) {
        if let Some(index) = CLIENT_BODY_ERROR_REASONS.iter().position(|r| *r == reason) {
            self.client_body_errors[index].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a retry on the next worker after a failed connect.
    pub fn record_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection refused because `max_connections` was reached.
    pub fn record_rejected_connection(&self) {
        self.rejected_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a telemetry event dropped because the aggregator's queue was full.
    pub fn record_telemetry_drop(&self) {
        self.telemetry_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the answer to a request that never got a worker (refused before or by routing).
    pub fn record_unrouted_response(&self, class: StatusClass) {
        self.unrouted_responses[class.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed probe of `worker` for `reason`.
    pub fn record_probe_failure(&self, worker: &WorkerKey, reason: ProbeReason) {
        let mut failures = self
            .probe_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        failures.entry(worker.clone()).or_default()[reason.index()] += 1;
    }

    /// Forgets the probe failures of workers for which `keep` is false (they left the fleet), so
    /// churn does not grow the series forever.
    pub fn retain_probe_failures(&self, keep: impl Fn(&WorkerKey) -> bool) {
        self.probe_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|worker, _| keep(worker));
    }
}

/// A histogram read from counters at scrape time: sum, count and per-bucket counts.
struct ConstHistogram {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl ConstHistogram {
    fn of(histogram: &DurationHistogram) -> Self {
        let (sum, count, buckets) = histogram.read();
        Self {
            sum,
            count,
            buckets,
        }
    }
}

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Builds the registry: the data-path metrics plus a collector over the router's worker counters
/// and the load scraper's counters.
pub fn registry(metrics: Arc<Metrics>, router: Arc<Router>, scrapes: Arc<ScrapeStats>) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        "bch_request_duration_seconds",
        "Proxied request duration until the last body byte or client disconnect",
        metrics.request_duration.clone(),
    );
    registry.register(
        "bch_response_headers_seconds",
        "Time until the worker's response headers arrived (engines send them before prefill: not the time to the first token)",
        metrics.response_headers.clone(),
    );
    registry.register(
        "bch_time_to_first_token_seconds",
        "Event streams: time until the first data chunk of the body (the first token of an LLM stream)",
        metrics.time_to_first_token.clone(),
    );
    registry.register_collector(Box::new(FleetLoadCollector {
        router: Arc::clone(&router),
        scrapes,
    }));
    registry.register_collector(Box::new(GatewayCollector { metrics, router }));
    registry
}

#[derive(Debug)]
struct GatewayCollector {
    metrics: Arc<Metrics>,
    router: Arc<Router>,
}

/// The fleet-wide load of every worker (docs/replicas.md): what the rule reads, what the worker
/// reported, how old that is, whether the rule fell back to local load, and how scrapes went.
#[derive(Debug)]
struct FleetLoadCollector {
    router: Arc<Router>,
    scrapes: Arc<ScrapeStats>,
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge<N>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, N)>,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<N>: EncodeMetric,
{
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// `bch_build_info` and the policy in force: what an alert or a dashboard annotation needs to
/// tell which build and which thresholds produced the numbers.
fn build_and_policy(
    encoder: &mut DescriptorEncoder,
    router: &Router,
) -> Result<(), std::fmt::Error> {
    gauge(
        encoder,
        "bch_build_info",
        "Always 1; the labels name the gatewayd build",
        [(
            vec![("version", env!("CARGO_PKG_VERSION").to_owned())],
            1i64,
        )],
    )?;
    let table = router.table();
    let policy = table.policy();
    gauge(
        encoder,
        "bch_policy_kind",
        "1 for the routing policy in force, 0 for the others",
        [
            PolicyKind::ConsistentHashing,
            PolicyKind::BoundedConsistentHashing,
            PolicyKind::RoundRobin,
            PolicyKind::Random,
        ]
        .map(|kind| {
            (
                vec![("kind", kind.as_str().to_owned())],
                i64::from(kind == policy.kind),
            )
        }),
    )?;
    gauge(
        encoder,
        "bch_policy_min_load_gap",
        "min_load_gap in force, in-flight requests (used by bounded_consistent_hashing only)",
        [(vec![], policy.min_load_gap as i64)],
    )?;
    gauge(
        encoder,
        "bch_policy_max_load_skew",
        "max_load_skew in force, a factor over the mean load (used by bounded_consistent_hashing only)",
        [(vec![], policy.max_load_skew)],
    )?;
    gauge(
        encoder,
        "bch_policy_spill_order",
        "1 for the spill order in force (ring or hash_seeded; used by bounded_consistent_hashing only), 0 for the other",
        SpillOrder::ALL.map(|order| {
            (
                vec![("order", order.as_str().to_owned())],
                i64::from(order == policy.spill_order),
            )
        }),
    )?;
    gauge(
        encoder,
        "bch_policy_virtual_nodes",
        "Ring points per worker",
        [(vec![], i64::from(policy.virtual_nodes))],
    )?;
    Ok(())
}

impl Collector for GatewayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        counter(
            &mut encoder,
            "bch_branch",
            "Routing decisions by branch",
            by_label("branch", |b: Branch| {
                m.branches[LabelValue::index(b)].load(Ordering::Relaxed)
            }),
        )?;
        counter(
            &mut encoder,
            "bch_ignored_routing_keys",
            "Explicit routing key headers ignored as absent, by reason",
            by_label("reason", |r: IgnoredKey| {
                m.ignored_keys[r.index()].load(Ordering::Relaxed)
            }),
        )?;
        counter(
            &mut encoder,
            "bch_client_body_errors",
            "Request bodies that failed on the client's side (never counted against a worker), by reason",
            CLIENT_BODY_ERROR_REASONS.iter().enumerate().map(|(i, r)| {
                (
                    vec![("reason", (*r).to_owned())],
                    m.client_body_errors[i].load(Ordering::Relaxed),
                )
            }),
        )?;
        counter(
            &mut encoder,
            "bch_retries",
            "Requests retried on the next worker after a failed connect",
            [(vec![], m.retries.load(Ordering::Relaxed))],
        )?;
        counter(
            &mut encoder,
            "bch_rejected_connections",
            "Data plane connections refused at max_connections",
            [(vec![], m.rejected_connections.load(Ordering::Relaxed))],
        )?;
        counter(
            &mut encoder,
            "bch_telemetry_dropped_events",
            "Routing events the telemetry aggregator could not take (queue full)",
            [(vec![], m.telemetry_dropped.load(Ordering::Relaxed))],
        )?;
        build_and_policy(&mut encoder, &self.router)?;
        let table = self.router.table();
        let workers = table.workers();
        let health = table.health();
        let label = |i: usize| vec![("worker", workers[i].spec.name.clone())];
        gauge(
            &mut encoder,
            "bch_worker_draining",
            "1 while the worker is draining (no new requests; its in-flight ones finish)",
            (0..workers.len()).map(|i| {
                (
                    label(i),
                    i64::from(table.states()[i] == WorkerState::Draining),
                )
            }),
        )?;
        counter(
            &mut encoder,
            "bch_responses",
            "Responses by status class (none: the client left before the head) and worker (empty: the request never got one)",
            StatusClass::ALL.iter().flat_map(|class| {
                let class = *class;
                let unrouted = (
                    vec![
                        ("status_class", class.as_str().to_owned()),
                        ("worker", String::new()),
                    ],
                    m.unrouted_responses[class.index()].load(Ordering::Relaxed),
                );
                std::iter::once(unrouted).chain((0..workers.len()).map(move |i| {
                    (
                        vec![
                            ("status_class", class.as_str().to_owned()),
                            ("worker", workers[i].spec.name.clone()),
                        ],
                        workers[i].stats.responses_total(class),
                    )
                }))
            }),
        )?;
        {
            let mut metric = encoder.encode_descriptor(
                "bch_worker_request_duration_seconds",
                "Duration of the requests routed to the worker, until the last body byte or client disconnect",
                None,
                MetricType::Histogram,
            )?;
            for (i, worker) in workers.iter().enumerate() {
                ConstHistogram::of(worker.stats.durations())
                    .encode(metric.encode_family(&label(i))?)?;
            }
        }
        // By name, as the series are shown; a worker that left is not shown, nor a reason that
        // never happened to a worker.
        let mut failures: Vec<(String, [u64; ProbeReason::ALL.len()])> = m
            .probe_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(key, counts)| {
                Some((workers[key.index_in(&table)?].spec.name.clone(), *counts))
            })
            .collect();
        failures.sort_unstable();
        counter(
            &mut encoder,
            "bch_probe_failures",
            "Failed health probes by worker and reason (refused, timeout, status, error)",
            failures.into_iter().flat_map(|(worker, counts)| {
                by_label("reason", move |r: ProbeReason| counts[r.index()])
                    .filter(|(_, n)| *n > 0)
                    .map(move |(mut labels, n)| {
                        labels.insert(0, ("worker", worker.clone()));
                        (labels, n)
                    })
            }),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_active",
            "In-flight requests of this gateway on the worker",
            (0..workers.len()).map(|i| (label(i), workers[i].stats.active() as i64)),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_healthy",
            "1 when the worker is healthy",
            (0..workers.len()).map(|i| (label(i), i64::from(health[i]))),
        )?;
        for (name, help, read) in [
            (
                "bch_worker_requests",
                "Requests routed to the worker",
                bch_core::load::WorkerStats::requests_total
                    as fn(&bch_core::load::WorkerStats) -> u64,
            ),
            (
                "bch_worker_spilled_in",
                "Requests spilled onto the worker",
                bch_core::load::WorkerStats::spilled_in_total,
            ),
            (
                "bch_worker_spilled_out",
                "Requests that preferred the worker but spilled elsewhere",
                bch_core::load::WorkerStats::spilled_out_total,
            ),
            (
                "bch_worker_errors",
                "Requests to the worker that ended in an error of the worker or the way to it (never the client's)",
                bch_core::load::WorkerStats::errors_total,
            ),
            (
                "bch_worker_health_changes",
                "Times the worker's health flipped (healthy to unhealthy or back)",
                bch_core::load::WorkerStats::health_changes_total,
            ),
        ] {
            counter(
                &mut encoder,
                name,
                help,
                (0..workers.len()).map(|i| (label(i), read(&workers[i].stats))),
            )?;
        }
        self.encode_discovery(&mut encoder, workers)
    }
}

impl GatewayCollector {
    /// Workers per source (`static` and every `dns:NAME`), and each discovery source's counters.
    fn encode_discovery(
        &self,
        encoder: &mut DescriptorEncoder,
        workers: &[bch_core::router::Worker],
    ) -> Result<(), std::fmt::Error> {
        let sources = self.metrics.discovery.snapshot();
        let mut per_source: BTreeMap<String, i64> = sources
            .iter()
            .map(|(label, _)| (label.clone(), 0))
            .collect();
        per_source.insert("static".to_owned(), 0);
        for worker in workers {
            *per_source
                .entry(worker.spec.source.label().into_owned())
                .or_default() += 1;
        }
        let source = |label: &str| vec![("source", label.to_owned())];
        gauge(
            encoder,
            "bch_discovery_workers",
            "Workers in the membership by source (static, or the dns:NAME that found them)",
            per_source.iter().map(|(label, n)| (source(label), *n)),
        )?;
        counter(
            encoder,
            "bch_discovery_refreshes",
            "DNS resolutions of a discovery source, whatever their outcome",
            sources
                .iter()
                .map(|(label, c)| (source(label), c.refreshes.load(Ordering::Relaxed))),
        )?;
        counter(
            encoder,
            "bch_discovery_errors",
            "DNS resolutions of a discovery source that failed (error, timeout, SERVFAIL); the last good set was kept",
            sources
                .iter()
                .map(|(label, c)| (source(label), c.errors.load(Ordering::Relaxed))),
        )?;
        gauge(
            encoder,
            "bch_discovery_skipped_records",
            "Records of the last answer that were skipped (port 0, no address, duplicate address)",
            sources.iter().map(|(label, c)| {
                (
                    source(label),
                    c.skipped_records.load(Ordering::Relaxed) as i64,
                )
            }),
        )
    }
}

impl Collector for FleetLoadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let table = self.router.table();
        let source = table.policy().load_source;
        gauge(
            &mut encoder,
            "bch_load_source",
            "1 for the load source the bounded rule reads (local or worker_metrics)",
            LoadSource::ALL.iter().map(|s| {
                (
                    vec![("source", s.as_str().to_owned())],
                    i64::from(*s == source),
                )
            }),
        )?;
        let records = table.worker_records(crate::clock::now_ms());
        let label = |name: &str| vec![("worker", name.to_owned())];
        gauge(
            &mut encoder,
            "bch_worker_load",
            "Load the bounded rule reads for the worker: in-flight requests of this gateway, or the fleet-wide load in worker_metrics mode",
            records
                .iter()
                .map(|r| (label(&r.name), r.rule_load() as i64)),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_reported_load",
            "Running plus waiting requests the worker reported at its last good scrape",
            records
                .iter()
                .filter_map(|r| Some((label(&r.name), r.reported_load? as i64))),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_load_scrape_age_seconds",
            "Age of the worker's last good load scrape",
            records
                .iter()
                .filter_map(|r| Some((label(&r.name), r.scrape_age_ms? as f64 / 1000.0))),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_load_stale",
            "1 when worker_metrics mode has no fresh sample of the worker and routes on local load",
            records
                .iter()
                .map(|r| (label(&r.name), i64::from(r.load_stale))),
        )?;
        let counts: Vec<_> = records
            .iter()
            .map(|r| self.scrapes.counts(&r.url))
            .collect();
        counter(
            &mut encoder,
            "bch_load_scrapes",
            "Load scrapes of the worker that gave a load",
            records
                .iter()
                .zip(&counts)
                .map(|(r, c)| (label(&r.name), c.ok)),
        )?;
        counter(
            &mut encoder,
            "bch_load_scrape_failures",
            "Load scrapes of the worker that failed, by reason",
            records.iter().zip(&counts).flat_map(|(r, c)| {
                by_label("reason", |reason: ScrapeReason| c.failures[reason.index()]).map(
                    move |(mut labels, n)| {
                        labels.insert(0, ("worker", r.name.clone()));
                        (labels, n)
                    },
                )
            }),
        )?;
        Ok(())
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Encoding into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
