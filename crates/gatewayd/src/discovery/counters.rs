//! Discovery's own metrics: each source's refreshes, errors and skipped records, and the workers
//! of the membership by source, registered by discovery itself (`bch_discovery_*`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bch_core::router::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::records::{AddressFamily, FailureKind};
use crate::metrics::{counter, gauge};

/// Counters of one discovery source.
#[derive(Debug, Default)]
pub struct SourceCounters {
    refreshes: AtomicU64,
    /// Failed resolutions by [`FailureKind::index`].
    errors: [AtomicU64; FailureKind::ALL.len()],
    skipped_records: AtomicU64,
    /// Failed A lookups and failed AAAA lookups whose other family answered.
    lookup_errors: [AtomicU64; 2],
}

impl SourceCounters {
    /// Counts one finished resolution, whatever its outcome.
    pub fn record_refresh(&self) {
        self.refreshes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed resolution of kind `kind` (a timeout, a truncated answer, an error).
    pub fn record_error(&self, kind: FailureKind) {
        self.errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one A or AAAA lookup that failed while the other family answered.
    pub fn record_lookup_error(&self, family: AddressFamily) {
        self.lookup_errors[family_index(family)].fetch_add(1, Ordering::Relaxed);
    }

    /// Records how many records the last answer had that could not be used.
    pub fn set_skipped_records(&self, count: usize) {
        self.skipped_records.store(count as u64, Ordering::Relaxed);
    }
}

fn family_index(family: AddressFamily) -> usize {
    match family {
        AddressFamily::A => 0,
        AddressFamily::Aaaa => 1,
    }
}

/// Every discovery source's counters by source label (`dns:NAME`). A source's counters live as
/// long as the process, across reloads, so its counts stay monotonic when a reload removes the
/// source and a later one adds it back; only the sources in force are exported, so a removed
/// source is not reported as a source without workers. Never touched by the data path.
#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    sources: Mutex<Sources>,
}

#[derive(Debug, Default)]
struct Sources {
    counters: BTreeMap<String, Arc<SourceCounters>>,
    /// Labels of the sources in force.
    in_force: BTreeSet<String>,
}

impl DiscoveryMetrics {
    /// The counters of the source labelled `label`, created on first use.
    pub fn source(&self, label: &str) -> Arc<SourceCounters> {
        let mut sources = self.lock();
        Arc::clone(sources.counters.entry(label.to_owned()).or_default())
    }

    /// The labels of the sources in force (after a reload, the ones it kept or added): only
    /// these are exported.
    pub fn set_in_force(&self, labels: BTreeSet<String>) {
        self.lock().in_force = labels;
    }

    /// Registers discovery's families in `registry`: these counters, and the workers of
    /// `router`'s table by source.
    pub fn register(self: &Arc<Self>, registry: &mut Registry, router: Arc<Router>) {
        registry.register_collector(Box::new(DiscoveryCollector {
            metrics: Arc::clone(self),
            router,
        }));
    }

    /// The counters of the sources in force.
    fn snapshot(&self) -> Vec<(String, Arc<SourceCounters>)> {
        let sources = self.lock();
        sources
            .counters
            .iter()
            .filter(|(label, _)| sources.in_force.contains(*label))
            .map(|(label, counters)| (label.clone(), Arc::clone(counters)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Workers per source (`static` and every `dns:NAME`), and each discovery source's counters.
#[derive(Debug)]
struct DiscoveryCollector {
    metrics: Arc<DiscoveryMetrics>,
    router: Arc<Router>,
}

impl Collector for DiscoveryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let encoder = &mut encoder;
        let sources = self.metrics.snapshot();
        let mut per_source: BTreeMap<String, i64> = sources
            .iter()
            .map(|(label, _)| (label.clone(), 0))
            .collect();
        per_source.insert("static".to_owned(), 0);
        for worker in self.router.table().workers() {
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
            "DNS resolutions of a discovery source that failed, by reason: timeout (no answer within timeout_ms), truncated (an answer too large for one DNS message), error (SERVFAIL, REFUSED, a broken connection, ...); the last good set was kept",
            sources.iter().flat_map(|(label, c)| {
                FailureKind::ALL.map(|kind| {
                    let mut labels = source(label);
                    labels.push(("reason", kind.as_str().to_owned()));
                    (labels, c.errors[kind.index()].load(Ordering::Relaxed))
                })
            }),
        )?;
        counter(
            encoder,
            "bch_discovery_lookup_errors",
            "A or AAAA lookups that failed (REFUSED, SERVFAIL, timeout) while the other family answered; the resolution stood on that family",
            sources.iter().flat_map(|(label, c)| {
                [AddressFamily::A, AddressFamily::Aaaa].map(|family| {
                    let mut labels = source(label);
                    labels.push(("record_type", family.as_str().to_owned()));
                    (
                        labels,
                        c.lookup_errors[family_index(family)].load(Ordering::Relaxed),
                    )
                })
            }),
        )?;
        gauge(
            encoder,
            "bch_discovery_skipped_records",
            "Records of the last answer that were skipped (port 0, no address, not unicast, duplicate address) and workers of it the membership left out (this gateway's own listener, name and address both taken)",
            sources.iter().map(|(label, c)| {
                (
                    source(label),
                    c.skipped_records.load(Ordering::Relaxed) as i64,
                )
            }),
        )
    }
}
