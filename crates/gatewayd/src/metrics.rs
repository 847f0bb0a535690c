//! Prometheus metrics (`GET /metrics` on the control plane), all prefixed `bch_`: the data path's
//! families, the policy and build gauges, and the encoding every component's collector shares.
//!
//! Each component registers its own families (like linkerd's sub-registries): the composition
//! root builds the registry here ([`registry`]) and hands it to the scraper, the prober and
//! discovery in turn, so this module knows none of them.
//!
//! Per-worker values are not kept in metric families: they are read from the router's atomic
//! counters at scrape time by a collector (responses by status class and durations too, from
//! bch-core's lock-free per-worker histogram), so the data path pays nothing for them and a removed
//! worker simply disappears from the next scrape. Branch counts are plain atomics for the same
//! reason; only the fleet-wide latency histograms take prometheus-client's short internal lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bch_core::load::{DurationHistogram, StatusClass, WorkerStats};
use bch_core::policy::{Branch, PolicyKind, SpillOrder};
use bch_core::router::{PoolId, Router, RoutingTable};
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

use crate::error::ClientBodyFault;
use crate::model_branches::ModelBranches;

/// A label with a fixed set of values: `ALL[value.index()] == value`, so a family's counters are
/// an array indexed by value. The one pattern of every labelled counter, here and in the
/// components' collectors.
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

impl LabelValue for ClientBodyFault {
    const ALL: &'static [Self] = &ClientBodyFault::ALL;

    fn index(self) -> usize {
        ClientBodyFault::index(self)
    }

    fn as_str(self) -> &'static str {
        ClientBodyFault::as_str(self)
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

/// One row of a family: its labels and its value.
pub type Row<N> = (Vec<(&'static str, String)>, N);

/// One row per value of `L` (label `name`), with `count(value)`.
pub fn by_label<L: LabelValue>(
    name: &'static str,
    count: impl Fn(L) -> u64,
) -> impl Iterator<Item = Row<u64>> {
    L::ALL
        .iter()
        .map(move |value| (vec![(name, value.as_str().to_owned())], count(*value)))
}

/// One row per value of `L` for the worker called `worker`: labels `worker`, then `name`.
pub fn by_worker_and_label<L: LabelValue>(
    worker: &str,
    name: &'static str,
    count: impl Fn(L) -> u64,
) -> impl Iterator<Item = Row<u64>> {
    by_label(name, count).map(move |(mut labels, n)| {
        labels.insert(0, ("worker", worker.to_owned()));
        (labels, n)
    })
}

/// Encodes the counter family `name` (`_total` is added) with `rows`.
pub fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = Row<u64>>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Encodes the gauge family `name` with `rows`.
pub fn gauge<N>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = Row<N>>,
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

/// Data-path metrics. Cheap to update: atomics, plus one histogram observation per response.
#[derive(Debug)]
pub struct Metrics {
    branches: [AtomicU64; Branch::ALL.len()],
    /// The same decisions per model, when the fleet declares models.
    branches_by_model: ModelBranches,
    ignored_keys: [AtomicU64; IgnoredKey::ALL.len()],
    client_body_errors: [AtomicU64; ClientBodyFault::ALL.len()],
    retries: AtomicU64,
    /// Streamed responses cut because their client stopped reading (`client_stall_timeout_ms`).
    client_stalls: AtomicU64,
    rejected_connections: AtomicU64,
    telemetry_dropped: AtomicU64,
    /// Responses of requests that never got a worker (413, 503), by status class.
    unrouted_responses: [AtomicU64; StatusClass::ALL.len()],
    /// Whole request duration, seconds (until the last body byte or the client left).
    pub request_duration: Histogram,
    /// Time until the worker's response headers arrived, seconds. Engines send headers before
    /// prefill, so this is not the time to the first token.
    pub response_headers: Histogram,
    /// Event streams: time until the first data chunk of the body reached the gateway, seconds.
    /// For an LLM stream that is the first token (the prefill's end).
    pub time_to_first_token: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            branches: Default::default(),
            branches_by_model: ModelBranches::default(),
            ignored_keys: Default::default(),
            client_body_errors: Default::default(),
            retries: AtomicU64::new(0),
            client_stalls: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            telemetry_dropped: AtomicU64::new(0),
            unrouted_responses: Default::default(),
            // 1 ms .. ~16 min: LLM requests range from instant cache hits to long generations.
            request_duration: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            response_headers: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            time_to_first_token: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
        }
    }
}

impl Metrics {
    /// Counts one routing decision, taken in `pool` of `table`: per model too when the fleet
    /// declares models (no lookup by name: the model's counters are found by pool index).
    pub fn record_branch(&self, branch: Branch, table: &RoutingTable, pool: PoolId) {
        let index = LabelValue::index(branch);
        self.branches[index].fetch_add(1, Ordering::Relaxed);
        self.branches_by_model.record(table, pool, index);
    }

    /// Counts an explicit routing key header that was ignored.
    pub fn record_ignored_key(&self, reason: IgnoredKey) {
        self.ignored_keys[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request body that failed on the client's side.
    pub fn record_client_body_error(&self, fault: ClientBodyFault) {
        self.client_body_errors[fault.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a response cut because its client stopped reading for `client_stall_timeout_ms`.
    pub fn record_client_stall(&self) {
        self.client_stalls.fetch_add(1, Ordering::Relaxed);
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

/// Builds the registry with the data path's families and a collector over the router's worker
/// counters; the components register theirs in it next.
pub fn registry(metrics: Arc<Metrics>, router: Arc<Router>) -> Registry {
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
    registry.register_collector(Box::new(GatewayCollector { metrics, router }));
    registry
}

/// The data path's counters, the build and policy in force, and every worker's own counters.
#[derive(Debug)]
struct GatewayCollector {
    metrics: Arc<Metrics>,
    router: Arc<Router>,
}

impl Collector for GatewayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let table = self.router.table();
        data_path(&mut encoder, &self.metrics, &table)?;
        build_and_policy(&mut encoder, &table)?;
        worker_states(&mut encoder, &table)?;
        responses(&mut encoder, &self.metrics, &table)?;
        worker_counters(&mut encoder, &table)
    }
}

/// The data path's own counters: routing branches (by model too when `table`'s fleet declares
/// models), ignored keys, client body errors, retries, refused connections and dropped telemetry
/// events.
fn data_path(
    encoder: &mut DescriptorEncoder,
    m: &Metrics,
    table: &RoutingTable,
) -> Result<(), std::fmt::Error> {
    let help = "Routing decisions by branch";
    if table.has_models() {
        // Only the labels change with models: a sum over `model` is the family without them.
        let pools = m.branches_by_model.of_pools(table);
        let rows = pools.iter().flat_map(|(model, counts)| {
            by_label("branch", |b: Branch| counts.get(LabelValue::index(b))).map(
                |(mut labels, n)| {
                    labels.push(("model", model.to_string()));
                    (labels, n)
                },
            )
        });
        counter(encoder, "bch_branch", help, rows)?;
    } else {
        counter(
            encoder,
            "bch_branch",
            help,
            by_label("branch", |b: Branch| {
                m.branches[LabelValue::index(b)].load(Ordering::Relaxed)
            }),
        )?;
    }
    counter(
        encoder,
        "bch_ignored_routing_keys",
        "Explicit routing key headers ignored as absent, by reason",
        by_label("reason", |r: IgnoredKey| {
            m.ignored_keys[r.index()].load(Ordering::Relaxed)
        }),
    )?;
    counter(
        encoder,
        "bch_client_body_errors",
        "Request bodies that failed on the client's side (never counted against a worker), by reason",
        by_label("reason", |f: ClientBodyFault| {
            m.client_body_errors[f.index()].load(Ordering::Relaxed)
        }),
    )?;
    for (name, help, value) in [
        (
            "bch_retries",
            "Requests retried on the next worker after a failed connect",
            &m.retries,
        ),
        (
            "bch_client_stalls",
            "Responses cut because the client stopped reading for client_stall_timeout_ms (never counted against a worker)",
            &m.client_stalls,
        ),
        (
            "bch_rejected_connections",
            "Data plane connections refused at max_connections",
            &m.rejected_connections,
        ),
        (
            "bch_telemetry_dropped_events",
            "Routing events the telemetry aggregator could not take (queue full)",
            &m.telemetry_dropped,
        ),
    ] {
        counter(
            encoder,
            name,
            help,
            [(vec![], value.load(Ordering::Relaxed))],
        )?;
    }
    Ok(())
}

/// `bch_build_info` and the policy in force: what an alert or a dashboard annotation needs to
/// tell which build and which thresholds produced the numbers.
fn build_and_policy(
    encoder: &mut DescriptorEncoder,
    table: &RoutingTable,
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

/// The `worker` label of each worker of `table`, in table order.
fn worker_labels(table: &RoutingTable) -> Vec<Vec<(&'static str, String)>> {
    table
        .workers()
        .iter()
        .map(|w| vec![("worker", w.spec.name.clone())])
        .collect()
}

/// Whether each worker drains, is healthy, and how many requests it has in flight.
fn worker_states(
    encoder: &mut DescriptorEncoder,
    table: &RoutingTable,
) -> Result<(), std::fmt::Error> {
    let labels = worker_labels(table);
    let draining = table.states().iter().map(|s| *s == WorkerState::Draining);
    gauge(
        encoder,
        "bch_worker_draining",
        "1 while the worker is draining (no new requests; its in-flight ones finish)",
        labels.iter().cloned().zip(draining.map(i64::from)),
    )?;
    let active = table.workers().iter().map(|w| w.stats.active() as i64);
    gauge(
        encoder,
        "bch_worker_active",
        "In-flight requests of this gateway on the worker",
        labels.iter().cloned().zip(active),
    )?;
    let healthy = table.healthy_flags().iter().map(|h| i64::from(*h));
    gauge(
        encoder,
        "bch_worker_healthy",
        "1 when the worker is healthy",
        labels.into_iter().zip(healthy),
    )
}

/// Responses by status class and worker (empty: never got one), and each worker's durations.
fn responses(
    encoder: &mut DescriptorEncoder,
    m: &Metrics,
    table: &RoutingTable,
) -> Result<(), std::fmt::Error> {
    let workers = table.workers();
    counter(
        encoder,
        "bch_responses",
        "Responses by status class (none: the client left before the head) and worker (empty: the request never got one)",
        StatusClass::ALL.iter().flat_map(|class| {
            let class = *class;
            let row = move |worker: String, n: u64| {
                let labels = vec![
                    ("status_class", class.as_str().to_owned()),
                    ("worker", worker),
                ];
                (labels, n)
            };
            let unrouted = row(
                String::new(),
                m.unrouted_responses[class.index()].load(Ordering::Relaxed),
            );
            std::iter::once(unrouted).chain(
                workers
                    .iter()
                    .map(move |w| row(w.spec.name.clone(), w.stats.responses_total(class))),
            )
        }),
    )?;
    let mut metric = encoder.encode_descriptor(
        "bch_worker_request_duration_seconds",
        "Duration of the requests routed to the worker, until the last body byte or client disconnect",
        None,
        MetricType::Histogram,
    )?;
    for (labels, worker) in worker_labels(table).iter().zip(workers) {
        ConstHistogram::of(worker.stats.durations()).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

/// Each worker's request, spill, error and health-change counters.
fn worker_counters(
    encoder: &mut DescriptorEncoder,
    table: &RoutingTable,
) -> Result<(), std::fmt::Error> {
    let labels = worker_labels(table);
    for (name, help, read) in [
        (
            "bch_worker_requests",
            "Requests routed to the worker",
            WorkerStats::requests_total as fn(&WorkerStats) -> u64,
        ),
        (
            "bch_worker_spilled_in",
            "Requests spilled onto the worker",
            WorkerStats::spilled_in_total,
        ),
        (
            "bch_worker_spilled_out",
            "Requests that preferred the worker but spilled elsewhere",
            WorkerStats::spilled_out_total,
        ),
        (
            "bch_worker_errors",
            "Requests to the worker that ended in an error of the worker or the way to it (never the client's)",
            WorkerStats::errors_total,
        ),
        (
            "bch_worker_health_changes",
            "Times the worker's health flipped (healthy to unhealthy or back)",
            WorkerStats::health_changes_total,
        ),
    ] {
        let values = table.workers().iter().map(|w| read(&w.stats));
        counter(encoder, name, help, labels.iter().cloned().zip(values))?;
    }
    Ok(())
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Encoding into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
