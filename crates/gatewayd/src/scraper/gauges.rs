//! Reading a worker's load out of its Prometheus text: the running and waiting gauges of the
//! engines gatewayd recognises, every series summed, and the engine's KV-cache usage.
//!
//! A vLLM exposition is some 40 KB of histograms of which three families matter, and a full
//! parse of it costs about a millisecond; scraping 64 workers ten times a second would spend most
//! of a core on it. So one pass picks out the sample lines whose metric name is a recognised gauge
//! (comments, `# EOF` and every other family are skipped by comparing names only), and only those
//! lines go through the text-format parser, which handles label escaping, `NaN`/`+Inf` and
//! timestamps.

use bch_core::admission::EngineReport;

/// The gauges of one engine: requests in the running batch and requests queued for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engine {
    /// Short name for logs and the metrics' `engine` label.
    pub name: &'static str,
    /// Running (or processing) requests.
    pub running: &'static str,
    /// Waiting (queued, deferred) requests.
    pub waiting: &'static str,
}

/// The engines recognised by name, in the order they are tried (docs/replicas.md lists where each
/// name comes from).
pub const ENGINES: [Engine; 5] = [
    Engine {
        name: "vllm",
        running: "vllm:num_requests_running",
        waiting: "vllm:num_requests_waiting",
    },
    Engine {
        name: "sglang",
        running: "sglang:num_running_reqs",
        waiting: "sglang:num_queue_reqs",
    },
    Engine {
        name: "sglang",
        running: "sglang_num_running_reqs",
        waiting: "sglang_num_queue_reqs",
    },
    Engine {
        name: "llama.cpp",
        running: "llamacpp:requests_processing",
        waiting: "llamacpp:requests_deferred",
    },
    Engine {
        name: "tgi",
        running: "tgi_batch_current_size",
        waiting: "tgi_queue_size",
    },
];

/// The largest load (running + waiting requests, every series summed) a worker's gauges may
/// report; a larger one is refused like NaN. A million requests is some thousand times what the
/// largest engine batches hold in flight and queued today, so no real worker reaches it, while
/// a broken or hostile exporter's 1e300 or 2^64 is not read as a load that makes every key
/// preferring that worker spill (docs/replicas.md).
pub const MAX_PLAUSIBLE_LOAD: u64 = 1_000_000;

/// The KV-cache usage gauges recognised by name (each a fraction, 0..1), in the order they are
/// tried: the first name with a sample in the text gives the usage. vLLM's current name comes
/// before the one it deprecated (versions in between export both, with the same value). TGI
/// exports no such gauge.
pub const KV_USAGE_GAUGES: [&str; 5] = [
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "sglang_token_usage",
    "llamacpp:kv_cache_usage_ratio",
];

/// A worker's load as its gauges report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Running + waiting requests, every series summed, rounded to whole requests.
    pub load: u64,
    /// Of which waiting (every series of the waiting gauge summed, rounded).
    pub waiting: u64,
    /// KV-cache usage, 0..1: the largest series of the first recognised KV gauge in the text (a
    /// request may land on any of an engine's data-parallel ranks, so the fullest one counts);
    /// `None` when the engine exports none.
    pub kv_usage: Option<f64>,
    /// Which engine's names matched (`custom` for the configured pair).
    pub engine: &'static str,
}

impl Reading {
    /// What the engine says about its saturation, for the capacity rule: its waiting requests and
    /// its KV-cache usage (0 when it exports none, which no `max_kv_usage` reads as full).
    pub fn engine_report(&self) -> EngineReport {
        EngineReport {
            waiting: self.waiting,
            kv_usage: self.kv_usage.unwrap_or(0.0),
        }
    }
}

/// Why a metrics body gave no load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GaugeError {
    /// None of the recognised gauges (nor the configured pair) is in the text.
    #[error("no recognised load gauge in the metrics text")]
    NoGauges,
    /// A line of a recognised gauge does not parse as a Prometheus sample.
    #[error("a load gauge line does not parse")]
    Unparsable,
    /// A recognised load gauge has a negative, NaN or infinite value, or the load is above
    /// [`MAX_PLAUSIBLE_LOAD`]; or a KV-cache usage gauge has a value outside 0..1 (or NaN).
    #[error(
        "a load gauge is negative, NaN, infinite or above 1000000 requests, or a KV-cache usage is outside 0..1"
    )]
    BadValue,
}

/// The load in `text`: the configured pair `custom` (running, waiting) first, then [`ENGINES`] in
/// order; the first engine with at least one of its two gauges present gives the load (so an
/// engine exporting both SGLang spellings is not counted twice). The KV-cache usage is read from
/// [`KV_USAGE_GAUGES`] whichever engine gave the load (a configured pair has no KV name of its
/// own, and its engine may still be a vLLM).
pub fn read_load(text: &str, custom: Option<(&str, &str)>) -> Result<Reading, GaugeError> {
    let mut sums = Sums::default();
    let names = GaugeNames::new(custom);
    let mut start = 0;
    // Line boundaries with the SIMD `memchr` (a vLLM body is ~400 lines of ~100 bytes): most of
    // a scrape's parsing time was finding newlines a word at a time.
    for end in memchr::memchr_iter(b'\n', text.as_bytes()).chain([text.len()]) {
        // A newline is a character boundary, so the slice is a whole string.
        let line = text[start..end].trim_start();
        let line = line.strip_suffix('\r').unwrap_or(line);
        start = end + 1;
        if let Some(gauge) = names.gauge_of_line(line.as_bytes()) {
            sums.add(gauge, line)?;
        }
    }
    sums.reading()
}

/// What a recognised sample line is a sample of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gauge {
    /// A load gauge of slot `slot` (0 the configured pair, then one per engine); `waiting` for
    /// the waiting gauge of the pair.
    Load { slot: usize, waiting: bool },
    /// The KV-cache usage gauge `KV_USAGE_GAUGES[rank]`.
    KvUsage { rank: usize },
}

/// Per load slot (0 the configured pair, then one per engine): whether any sample was seen, the
/// sum of the values and the sum of the waiting gauge's; per KV gauge: whether seen, and the
/// largest series.
#[derive(Default)]
struct Sums {
    seen: [bool; ENGINES.len() + 1],
    sums: [f64; ENGINES.len() + 1],
    waiting: [f64; ENGINES.len() + 1],
    kv_seen: [bool; KV_USAGE_GAUGES.len()],
    kv_max: [f64; KV_USAGE_GAUGES.len()],
}

impl Sums {
    /// Adds the value of the sample `line` of `gauge`.
    fn add(&mut self, gauge: Gauge, line: &str) -> Result<(), GaugeError> {
        let value = sample_value(line)?;
        match gauge {
            Gauge::Load { slot, waiting } => {
                if !value.is_finite() || value < 0.0 {
                    return Err(GaugeError::BadValue);
                }
                self.seen[slot] = true;
                self.sums[slot] += value;
                if waiting {
                    self.waiting[slot] += value;
                }
                // Checked on the running sum, not only on each sample: plausible series can add
                // up to an implausible load, and the load is what the rule reads. A sum above the
                // bound stays above it (every value is non-negative), so failing at once reads
                // what failing at the end would.
                if self.sums[slot].round() > MAX_PLAUSIBLE_LOAD as f64 {
                    return Err(GaugeError::BadValue);
                }
            }
            Gauge::KvUsage { rank } => {
                // A fraction: a percentage (0..100) or garbage would read as a worker always
                // full, or never, so it is refused rather than clamped. `contains` is false for NaN.
                if !(0.0..=1.0).contains(&value) {
                    return Err(GaugeError::BadValue);
                }
                self.kv_max[rank] = if self.kv_seen[rank] {
                    self.kv_max[rank].max(value)
                } else {
                    value
                };
                self.kv_seen[rank] = true;
            }
        }
        Ok(())
    }

    /// The load of the first slot with a sample, with the first KV gauge seen.
    fn reading(&self) -> Result<Reading, GaugeError> {
        let slot = self
            .seen
            .iter()
            .position(|s| *s)
            .ok_or(GaugeError::NoGauges)?;
        let engine = match slot {
            0 => "custom",
            n => ENGINES[n - 1].name,
        };
        // A sum of gauges is a whole number of requests up to float noise; `add` kept the load
        // (and so its waiting part) at or below the plausibility bound, so the conversion is exact.
        Ok(Reading {
            load: self.sums[slot].round() as u64,
            waiting: self.waiting[slot].round() as u64,
            kv_usage: self
                .kv_seen
                .iter()
                .position(|s| *s)
                .map(|rank| self.kv_max[rank]),
            engine,
        })
    }
}

/// The number of names a scrape looks for: two per load slot, and the KV gauges.
const NAMES: usize = 2 * ENGINES.len() + 2 + KV_USAGE_GAUGES.len();

/// The recognised gauge names and what each is a sample of.
struct GaugeNames<'a> {
    names: [(&'a [u8], Gauge); NAMES],
    len: usize,
}

impl<'a> GaugeNames<'a> {
    fn new(custom: Option<(&'a str, &'a str)>) -> Self {
        let none = Gauge::KvUsage { rank: 0 };
        let mut names = [(&b""[..], none); NAMES];
        let mut len = 0;
        let mut push = |name: &'a str, gauge: Gauge| {
            // An empty configured name would match every line; configuration refuses it, and
            // here it is simply not a name.
            if !name.is_empty() {
                names[len] = (name.as_bytes(), gauge);
                len += 1;
            }
        };
        let load = |slot, waiting| Gauge::Load { slot, waiting };
        if let Some((running, waiting)) = custom {
            push(running, load(0, false));
            push(waiting, load(0, true));
        }
        for (i, engine) in ENGINES.iter().enumerate() {
            push(engine.running, load(i + 1, false));
            push(engine.waiting, load(i + 1, true));
        }
        for (rank, name) in KV_USAGE_GAUGES.iter().enumerate() {
            push(name, Gauge::KvUsage { rank });
        }
        GaugeNames { names, len }
    }

    /// What a sample line (leading blanks and a trailing `\r` removed) is a sample of, when its
    /// metric name is a recognised gauge; `None` for comments, blank lines and every other
    /// family. A name matches only whole: the byte after it must end the name (`{`, a blank, or
    /// the end of the line), so `vllm:num_requests_running_total` is not
    /// `vllm:num_requests_running`.
    fn gauge_of_line(&self, line: &[u8]) -> Option<Gauge> {
        if line.first().is_none_or(|b| *b == b'#') {
            return None;
        }
        self.names[..self.len].iter().find_map(|(name, gauge)| {
            // The byte after the name is checked first: for a line of another family it is
            // almost always a letter, so most names are rejected without comparing them.
            let ends_name = match line.get(name.len()) {
                None => line.len() == name.len(),
                Some(b) => matches!(b, b'{' | b' ' | b'\t'),
            };
            (ends_name && line.starts_with(name)).then_some(*gauge)
        })
    }
}

/// The value of one sample line, parsed by the text-format parser (labels with escaped quotes or
/// braces, `+Inf`, `NaN`, an optional timestamp).
fn sample_value(line: &str) -> Result<f64, GaugeError> {
    let (metrics, error) = prom_text_format_parser::parse_scrape(line);
    if error.is_some() {
        return Err(GaugeError::Unparsable);
    }
    let sample = metrics
        .first()
        .and_then(|m| m.samples.first())
        .ok_or(GaugeError::Unparsable)?;
    // The parser validated the number's shape; Rust's parser reads every shape it accepts
    // (`NaN`, `+Inf` case-insensitively), and a refusal is an unparsable line, not a panic.
    sample
        .value
        .value
        .parse::<f64>()
        .map_err(|_| GaugeError::Unparsable)
}

#[cfg(test)]
mod tests;
