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
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The straightforward reading the fast scan must agree with: every line, its name up to the
    /// first `{` or blank, looked up among the names in precedence order.
    fn reference(text: &str, custom: Option<(&str, &str)>) -> Result<Reading, GaugeError> {
        let mut sums = Sums::default();
        for line in text.split('\n') {
            let line = line.trim_start();
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let name = &line[..line.find(['{', ' ', '\t']).unwrap_or(line.len())];
            let gauge = match custom {
                Some((running, _)) if !running.is_empty() && running == name => Gauge::Load {
                    slot: 0,
                    waiting: false,
                },
                Some((_, waiting)) if !waiting.is_empty() && waiting == name => Gauge::Load {
                    slot: 0,
                    waiting: true,
                },
                _ => {
                    if let Some(i) = ENGINES
                        .iter()
                        .position(|e| e.running == name || e.waiting == name)
                    {
                        Gauge::Load {
                            slot: i + 1,
                            waiting: ENGINES[i].running != name,
                        }
                    } else if let Some(rank) = KV_USAGE_GAUGES.iter().position(|n| *n == name) {
                        Gauge::KvUsage { rank }
                    } else {
                        continue;
                    }
                }
            };
            sums.add(gauge, line)?;
        }
        sums.reading()
    }

    /// Lines of the kinds a scrape meets: recognised gauges with and without labels, look-alike
    /// names, comments, blanks, other families, broken values.
    fn line() -> impl Strategy<Value = String> {
        let names = prop::sample::select(vec![
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:num_requests_running_total",
            "vllm:num_requests",
            "sglang:num_running_reqs",
            "sglang_num_queue_reqs",
            "llamacpp:requests_deferred",
            "tgi_queue_size",
            "my_active",
            "my_queued",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "vllm:kv_cache_usage_perc_max",
            "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio",
        ]);
        let labels = prop::sample::select(vec!["", "{engine=\"0\"}", "{m=\"a \\\" {b}\"}", "{"]);
        let values = prop::sample::select(vec![
            "3",
            "0.5",
            "1e2",
            "NaN",
            "-1",
            "x",
            "+Inf",
            "2 1712345678000",
            "0.25",
            "1.5",
        ]);
        let sample = (
            names,
            labels,
            values,
            prop::sample::select(vec!["", "  ", "\t"]),
            any::<bool>(),
        )
            .prop_map(|(n, l, v, lead, crlf)| {
                format!("{lead}{n}{l} {v}{}", if crlf { "\r" } else { "" })
            });
        prop_oneof![
            4 => sample,
            1 => Just("# TYPE vllm:num_requests_running gauge".to_owned()),
            1 => Just(String::new()),
            1 => Just("# EOF".to_owned()),
            1 => "[ -~]{0,40}",
        ]
    }

    proptest! {
        #[test]
        fn the_fast_scan_reads_what_a_plain_reading_reads(
            lines in prop::collection::vec(line(), 0..30),
            custom in any::<bool>(),
        ) {
            let text = lines.join("\n");
            let custom = custom.then_some(("my_active", "my_queued"));
            prop_assert_eq!(read_load(&text, custom), reference(&text, custom));
        }
    }

    const VLLM: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 11929.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m, \"quoted\" {braced}"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_running_total Not a gauge we read, despite the prefix.
vllm:num_requests_running_total 99
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.875
# EOF
"#;

    #[test]
    fn vllm_series_are_summed() {
        let reading = read_load(VLLM, None).unwrap();
        assert_eq!(
            reading,
            Reading {
                load: 6,
                waiting: 2,
                kv_usage: Some(0.875),
                engine: "vllm"
            }
        );
        assert_eq!(
            reading.engine_report(),
            EngineReport {
                waiting: 2,
                kv_usage: 0.875
            }
        );
    }

    #[test]
    fn every_engine_is_recognised() {
        for (text, load, waiting, kv_usage, engine) in [
            (
                "sglang:num_running_reqs{model_name=\"m\"} 4\nsglang:num_queue_reqs{model_name=\"m\"} 3\nsglang:token_usage{model_name=\"m\"} 0.28\n",
                7,
                3,
                Some(0.28),
                "sglang",
            ),
            (
                "sglang_num_running_reqs 2\nsglang_num_queue_reqs 1 1712345678000\nsglang_token_usage 0.5\n",
                3,
                1,
                Some(0.5),
                "sglang",
            ),
            (
                "# HELP llamacpp:requests_processing Number of requests processing.\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 5\n# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\nllamacpp:kv_cache_usage_ratio 0.63\n",
                6,
                5,
                Some(0.63),
                "llama.cpp",
            ),
            // Recent llama-server builds dropped the KV gauge: waiting still counts.
            (
                "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n",
                1,
                0,
                None,
                "llama.cpp",
            ),
            // TGI exports no KV-cache usage.
            (
                "tgi_batch_current_size 8\ntgi_queue_size 2\n",
                10,
                2,
                None,
                "tgi",
            ),
            // vLLM before the rename.
            (
                "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.9\n",
                1,
                0,
                Some(0.9),
                "vllm",
            ),
        ] {
            assert_eq!(
                read_load(text, None),
                Ok(Reading {
                    load,
                    waiting,
                    kv_usage,
                    engine
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn the_current_kv_name_wins_over_the_deprecated_one() {
        // vLLM versions between the two names export both; the current one is read, alone.
        let text = "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.25\nvllm:kv_cache_usage_perc 0.5\n";
        assert_eq!(read_load(text, None).unwrap().kv_usage, Some(0.5));
        // A KV gauge alone is no load.
        assert_eq!(
            read_load("vllm:kv_cache_usage_perc 0.5\n", None),
            Err(GaugeError::NoGauges)
        );
        // With a configured pair, the engine's KV gauge is still read.
        let custom = "my_active 3\nmy_queued 1\nvllm:kv_cache_usage_perc 0.75\n";
        let reading = read_load(custom, Some(("my_active", "my_queued"))).unwrap();
        assert_eq!(
            (reading.load, reading.waiting, reading.kv_usage),
            (4, 1, Some(0.75))
        );
        // No KV gauge: a report of 0, which no max_kv_usage reads as full.
        let reading = read_load("tgi_batch_current_size 8\ntgi_queue_size 2\n", None).unwrap();
        assert_eq!(reading.engine_report().kv_usage, 0.0);
    }

    #[test]
    fn a_kv_usage_outside_zero_to_one_is_refused() {
        let kv = |value: &str| {
            read_load(
                &format!(
                    "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc{{engine=\"0\"}} {value}\n"
                ),
                None,
            )
        };
        for bad in ["NaN", "-0.01", "1.0001", "42", "+Inf", "-Inf"] {
            assert_eq!(kv(bad), Err(GaugeError::BadValue), "{bad}");
        }
        for (good, read) in [("0", 0.0), ("1", 1.0), ("1e-1", 0.1), ("0.999", 0.999)] {
            assert_eq!(kv(good).unwrap().kv_usage, Some(read), "{good}");
        }
        // One bad series among good ones refuses the scrape: its report cannot be trusted.
        let text = "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 99\n";
        assert_eq!(read_load(text, None), Err(GaugeError::BadValue));
        assert_eq!(
            read_load("sglang:num_running_reqs 1\nsglang:token_usage NaN\n", None),
            Err(GaugeError::BadValue)
        );
        assert_eq!(
            read_load(
                "llamacpp:requests_processing 1\nllamacpp:kv_cache_usage_ratio 1.5\n",
                None
            ),
            Err(GaugeError::BadValue)
        );
        assert_eq!(
            read_load(
                "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc full\n",
                None
            ),
            Err(GaugeError::Unparsable)
        );
    }

    #[test]
    fn the_configured_pair_comes_first() {
        let text = "my_active 5\nmy_queued{q=\"a\"} 1\nmy_queued{q=\"b\"} 1\nvllm:num_requests_running 9\n";
        assert_eq!(
            read_load(text, Some(("my_active", "my_queued"))),
            Ok(Reading {
                load: 7,
                waiting: 2,
                kv_usage: None,
                engine: "custom"
            })
        );
        assert_eq!(read_load(text, None).unwrap().load, 9);
    }

    #[test]
    fn one_engine_only_even_if_two_spellings_are_exported() {
        let text = "sglang:num_running_reqs 4\nsglang_num_running_reqs 4\n";
        assert_eq!(read_load(text, None).unwrap().load, 4);
    }

    #[test]
    fn implausible_loads_are_refused_like_nan() {
        let running =
            |value: &str| read_load(&format!("vllm:num_requests_running {value}\n"), None);
        for absurd in ["1e300", "18446744073709551616", "1000001", "-1"] {
            assert_eq!(running(absurd), Err(GaugeError::BadValue), "{absurd}");
        }
        assert_eq!(running("1000000").unwrap().load, MAX_PLAUSIBLE_LOAD);
        // Series each plausible whose sum is not: the load is the sum, refused as a whole.
        let split = "vllm:num_requests_running{engine=\"0\"} 600000\nvllm:num_requests_waiting{engine=\"0\"} 400001\n";
        assert_eq!(read_load(split, None), Err(GaugeError::BadValue));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(read_load("", None), Err(GaugeError::NoGauges));
        assert_eq!(
            read_load("<html>404 Not Found</html>\n", None),
            Err(GaugeError::NoGauges)
        );
        assert_eq!(
            read_load("vllm:num_requests_running three\n", None),
            Err(GaugeError::Unparsable)
        );
        assert_eq!(
            read_load("vllm:num_requests_running{model=\"m} 3\n", None),
            Err(GaugeError::Unparsable)
        );
        assert_eq!(
            read_load("vllm:num_requests_running -1\n", None),
            Err(GaugeError::BadValue)
        );
        assert_eq!(
            read_load("vllm:num_requests_running NaN\n", None),
            Err(GaugeError::BadValue)
        );
        assert_eq!(
            read_load("vllm:num_requests_running +Inf\n", None),
            Err(GaugeError::BadValue)
        );
        assert_eq!(
            read_load("vllm:num_requests_running 1e3\n", None)
                .unwrap()
                .load,
            1000
        );
        // Arbitrary bytes never panic.
        let noise: String = (0..2000u32)
            .map(|i| char::from_u32((i * 7919) % 0x2FF).unwrap_or('?'))
            .collect();
        let _ = read_load(&noise, None);
        let _ = read_load(&format!("vllm:num_requests_running{noise}"), None);
    }
}
