//! The scraper's own metrics, registered by the scraper: the fleet-wide load of every worker
//! (docs/replicas.md): what the rule reads, what the worker reported, how old that is, whether
//! the rule fell back to local load, how scrapes went, and the engine report the capacity rule
//! compares with `[admission] max_waiting` and `max_kv_usage`.

use std::sync::Arc;

use bch_core::fleet_load::LoadSource;
use bch_core::router::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::scrape::ScrapeReason;
use super::status::ScrapeStats;
use crate::metrics::{LabelValue, by_label, counter, gauge};

impl ScrapeStats {
    /// Registers the scraper's families in `registry`: these counters, and the load source and
    /// samples of `router`'s workers.
    pub fn register(self: &Arc<Self>, registry: &mut Registry, router: Arc<Router>) {
        registry.register_collector(Box::new(LoadCollector {
            router,
            scrapes: Arc::clone(self),
        }));
    }
}

/// Reads the router's worker samples and the scrape counters at scrape time.
#[derive(Debug)]
struct LoadCollector {
    router: Arc<Router>,
    scrapes: Arc<ScrapeStats>,
}

impl Collector for LoadCollector {
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
        // A record's URL is its worker's key.
        let reports: Vec<_> = records
            .iter()
            .map(|r| self.scrapes.engine_report(&r.url))
            .collect();
        gauge(
            &mut encoder,
            "bch_worker_engine_waiting",
            "Requests waiting in the worker's engine at its last good scrape, as the capacity rule reads them against max_waiting (absent when no report is held)",
            records
                .iter()
                .zip(&reports)
                .filter_map(|(r, e)| Some((label(&r.name), e.as_ref()?.waiting as i64))),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_engine_kv_usage",
            "KV-cache usage (0..1) of the worker's engine at its last good scrape, as the capacity rule reads it against max_kv_usage (absent when no report is held or the engine exports none)",
            records
                .iter()
                .zip(&reports)
                .filter_map(|(r, e)| Some((label(&r.name), e.as_ref()?.kv_usage?))),
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
