//! The endpoint picker's own counters: what peers reported, and the streams its bounds ended or
//! refused. Plain atomics, read by a collector at scrape time; the picker registers the family
//! itself, as every component does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::metrics::{counter, gauge};

/// The picker's counters and its open-stream gauge.
#[derive(Debug, Default)]
pub struct PickerMetrics {
    /// Response headers reporting that Envoy served a listed fallback.
    fallback_reports: AtomicU64,
    /// Streams ended because Envoy sent nothing for `[picker] silent_stream_timeout_ms`.
    silent_streams: AtomicU64,
    /// Streams refused because `[picker] max_streams` were open.
    refused_streams: AtomicU64,
    /// Streams open now.
    open_streams: AtomicU64,
}

impl PickerMetrics {
    /// Registers the picker's families in `registry`.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(PickerCollector(Arc::clone(self))));
    }

    /// Counts one report of a served fallback.
    pub fn record_fallback_report(&self) {
        self.fallback_reports.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one stream ended for its silence.
    pub fn record_silent_stream(&self) {
        self.silent_streams.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one stream refused at the cap.
    pub fn record_refused_stream(&self) {
        self.refused_streams.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one of `cap` stream slots: `false` (nothing taken) when all are in use. The slot is
    /// given back by [`PickerMetrics::close_stream`].
    pub fn open_stream(&self, cap: u64) -> bool {
        self.open_streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < cap).then_some(open + 1)
            })
            .is_ok()
    }

    /// Gives back a slot [`PickerMetrics::open_stream`] took.
    pub fn close_stream(&self) {
        self.open_streams.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
struct PickerCollector(Arc<PickerMetrics>);

impl Collector for PickerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.0;
        for (name, help, value) in [
            (
                "bch_picker_fallback_reports",
                "Envoy reports of a served fallback endpoint (each asks for a probe of the chosen worker; none counts against it)",
                &m.fallback_reports,
            ),
            (
                "bch_picker_silent_streams",
                "ext_proc streams ended because Envoy sent nothing for [picker] silent_stream_timeout_ms",
                &m.silent_streams,
            ),
            (
                "bch_picker_refused_streams",
                "ext_proc streams refused because [picker] max_streams were open",
                &m.refused_streams,
            ),
        ] {
            counter(
                &mut encoder,
                name,
                help,
                [(vec![], value.load(Ordering::Relaxed))],
            )?;
        }
        gauge(
            &mut encoder,
            "bch_picker_streams",
            "ext_proc streams open now",
            [(
                vec![],
                i64::try_from(m.open_streams.load(Ordering::Relaxed)).unwrap_or(i64::MAX),
            )],
        )
    }
}
