//! The gauge reading's tests: the fast scan against a plain reading, each engine's names, bad
//! values.

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
    let text =
        "my_active 5\nmy_queued{q=\"a\"} 1\nmy_queued{q=\"b\"} 1\nvllm:num_requests_running 9\n";
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
    let running = |value: &str| read_load(&format!("vllm:num_requests_running {value}\n"), None);
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
