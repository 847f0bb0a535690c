//! The admission families on `/metrics`, read at scrape time from the queue's counters and the
//! routing table in force: the queue's length, its wait-time histogram, admissions (at once or
//! after waiting), sheds by reason, and each worker's capacity and full flag.

use std::sync::Arc;

use bch_core::admission::ShedReason;
use bch_core::router::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::queue::AdmissionQueue;
use crate::metrics::{LabelValue, by_label, counter, gauge};

impl LabelValue for ShedReason {
    const ALL: &'static [Self] = &ShedReason::ALL;

    fn index(self) -> usize {
        self as usize
    }

    fn as_str(self) -> &'static str {
        ShedReason::as_str(self)
    }
}

impl AdmissionQueue {
    /// Registers the admission families in `registry`, over this queue and `router`'s table.
    pub fn register(self: &Arc<Self>, registry: &mut Registry, router: Arc<Router>) {
        registry.register(
            "bch_admission_queue_wait_seconds",
            "Time admitted requests waited in the gateway's admission queue",
            self.wait_seconds().clone(),
        );
        registry.register_collector(Box::new(AdmissionCollector {
            queue: Arc::clone(self),
            router,
        }));
    }
}

/// Reads the admission counters and the capacity of each worker at scrape time.
#[derive(Debug)]
struct AdmissionCollector {
    queue: Arc<AdmissionQueue>,
    router: Arc<Router>,
}

impl Collector for AdmissionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.queue.stats();
        gauge(
            &mut encoder,
            "bch_admission_queue_length",
            "Requests waiting in the gateway's admission queue now (they hold no load)",
            [(Vec::new(), stats.waiting() as i64)],
        )?;
        let (at_once, after_waiting) = stats.admitted_total();
        counter(
            &mut encoder,
            "bch_admission_admitted",
            "Requests given a worker, at once or after waiting in the admission queue",
            [
                (vec![("waited", "false".to_owned())], at_once),
                (vec![("waited", "true".to_owned())], after_waiting),
            ],
        )?;
        counter(
            &mut encoder,
            "bch_admission_shed",
            "Requests answered 503 with Retry-After because no worker they may use had room, by reason",
            by_label("reason", |reason: ShedReason| stats.shed_total(reason)),
        )?;
        let table = self.router.table();
        let labels = |name: &str| vec![("worker", name.to_owned())];
        gauge(
            &mut encoder,
            "bch_worker_capacity",
            "Requests in flight the worker may hold (0: no cap)",
            table.workers().iter().enumerate().map(|(index, worker)| {
                let capacity = table.capacity(index).unwrap_or(0);
                // Caps are at most a million (bch-core refuses more); saturate rather than trust it.
                let capacity = i64::try_from(capacity).unwrap_or(i64::MAX);
                (labels(&worker.spec.name), capacity)
            }),
        )?;
        gauge(
            &mut encoder,
            "bch_worker_full",
            "1 while the worker is at capacity or its engine reports saturation (not eligible for new requests)",
            table
                .workers()
                .iter()
                .enumerate()
                .map(|(index, worker)| (labels(&worker.spec.name), i64::from(table.full(index)))),
        )
    }
}
