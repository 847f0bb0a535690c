//! `gatewayd explain`: one answer from flags, the spill order, and `--batch` against the golden
//! bounded-policy vectors, with bad lines and 10,000 lines.

use std::time::Instant;

use serde_json::{Value, json};

use super::*;

fn golden() -> Value {
    serde_json::from_str(include_str!(
        "../../../core/tests/fixtures/bounded_decisions.json"
    ))
    .unwrap()
}

/// The golden cases as scenario lines (top-level `workers` added, `expect_*` stripped) and the
/// expected answers.
fn golden_scenarios() -> Vec<(String, Value)> {
    let golden = golden();
    golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let mut scenario = case.as_object().unwrap().clone();
            let expected = json!({
                "worker": scenario.remove("expect_worker").unwrap(),
                "branch": scenario.remove("expect_branch").unwrap(),
            });
            assert!(
                scenario.keys().all(|k| !k.starts_with("expect_")),
                "{scenario:?}"
            );
            scenario.insert("workers".into(), golden["workers"].clone());
            (Value::Object(scenario).to_string(), expected)
        })
        .collect()
}

#[test]
fn explain_prints_one_answer_as_json() {
    let golden = golden();
    let workers: Vec<&str> = golden["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let mut command = gatewayd();
    command.arg("explain");
    for w in &workers {
        command.args(["--worker", w]);
    }
    // The golden near-idle case: three in flight on the preferred worker spill at gap 2, skew 1.5.
    let case = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["expect_branch"] == "explicit_routing_key_spillover")
        .expect("a golden spill case");
    for (url, load) in case["loads"].as_object().unwrap() {
        command.args(["--load", &format!("{url}={load}")]);
    }
    for (url, healthy) in case["healthy"].as_object().unwrap() {
        if healthy == false {
            command.args(["--unhealthy", url]);
        }
    }
    command.args([
        "--routing-key",
        case["routing_key"].as_str().unwrap(),
        "--min-load-gap",
        &case["min_load_gap"].to_string(),
        "--max-load-skew",
        &case["max_load_skew"].to_string(),
    ]);
    if case["explicit"] == false {
        command.arg("--implicit");
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(answer["worker"], case["expect_worker"], "{answer}");
    assert_eq!(answer["branch"], case["expect_branch"], "{answer}");
    assert!(answer["preferred"].is_string(), "{answer}");
    assert_ne!(answer["preferred"], answer["worker"], "a spill: {answer}");
    assert!(answer["bound"].is_object(), "{answer}");

    // Implicit keys never spill.
    let mut implicit = gatewayd();
    implicit.arg("explain");
    for w in &workers {
        implicit.args(["--worker", w]);
    }
    let output = implicit
        .args(["--load", &format!("{}=50", workers[0])])
        .args(["--routing-key", "Bearer abc", "--implicit"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["branch"], "implicit_routing_key_hit");

    // Bad thresholds are refused with exit 1.
    let output = gatewayd()
        .args(["explain", "--worker", workers[0], "--routing-key", "k"])
        .args(["--max-load-skew", "0.5"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("max_load_skew"));
}

/// `--spill-order` reaches the decision: with every other worker idle, the ring order spills to the
/// key's clockwise successor and `hash_seeded` to the first other worker of the key's seeded order.
#[test]
fn explain_takes_the_spill_order() {
    let workers: Vec<String> = (1..=5).map(|i| format!("http://10.9.0.{i}:8000")).collect();
    let ring = bch_core::ring::Ring::build(&workers, 150);
    // A key whose two orders disagree, so the answer tells them apart.
    let (key, walk, seeded_first) = (0..100)
        .find_map(|i| {
            let key = format!("spill-order-{i}");
            let position = bch_core::routing_key::ExplicitKey::parse(key.as_bytes())
                .unwrap()
                .position();
            let walk = ring.workers_from(position);
            let first = *ring
                .seeded_order(position)
                .iter()
                .find(|&&w| w != walk[0])
                .unwrap();
            (first != walk[1]).then_some((key, walk, first))
        })
        .unwrap();
    let key = key.as_str();
    for (order, expected) in [("ring", walk[1]), ("hash_seeded", seeded_first)] {
        let mut command = gatewayd();
        command.arg("explain");
        for w in &workers {
            command.args(["--worker", w]);
        }
        let output = command
            .args(["--load", &format!("{}=9", workers[walk[0]])])
            .args(["--routing-key", key, "--spill-order", order])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            answer["branch"], "explicit_routing_key_spillover",
            "{answer}"
        );
        assert_eq!(
            answer["worker"],
            workers[expected].as_str(),
            "{order}: {answer}"
        );
    }
    let output = gatewayd()
        .args(["explain", "--worker", &workers[0], "--routing-key", "k"])
        .args(["--spill-order", "next"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "clap refuses an unknown order"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("spill_order"));
}

#[test]
fn explain_batch_reproduces_the_golden_decisions_in_order() {
    let scenarios = golden_scenarios();
    assert!(scenarios.len() >= 50, "{}", scenarios.len());
    let input: String = scenarios
        .iter()
        .map(|(line, _)| format!("{line}\n"))
        .collect();
    let mut command = gatewayd();
    command.args(["explain", "--batch"]);
    let output = run_with_stdin(command, input);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    for line in stdout.lines() {
        assert!(
            line.starts_with(r#"{"worker":"#) && line.contains(r#","branch":"#),
            "documented field order: {line}"
        );
    }
    let answers = stdout_lines(&output);
    assert_eq!(answers.len(), scenarios.len());
    for (i, ((line, expected), answer)) in scenarios.iter().zip(&answers).enumerate() {
        assert_eq!(answer, expected, "line {}: {line}", i + 1);
    }
}

#[test]
fn explain_batch_reports_bad_lines_and_answers_the_rest() {
    let scenarios = golden_scenarios();
    let mut lines: Vec<String> = scenarios.iter().take(6).map(|(l, _)| l.clone()).collect();
    let mut bad_skew: Value = serde_json::from_str(&lines[0]).unwrap();
    bad_skew["max_load_skew"] = json!(0.5);
    let mut stray: Value = serde_json::from_str(&lines[0]).unwrap();
    stray["loads"]["http://elsewhere:1"] = json!(3);
    // Lines 3, 5, 7 and 9 are bad in different ways; 1-based numbering.
    lines.insert(2, "{\"workers\": [".to_owned());
    lines.insert(4, bad_skew.to_string());
    lines.insert(
        6,
        r#"{"workers":["http://a:1"],"routing_key":"k","explicit":true,"colour":"red"}"#.to_owned(),
    );
    lines.insert(8, stray.to_string());
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let mut command = gatewayd();
    command.args(["explain", "--batch"]);
    let output = run_with_stdin(command, input);
    assert_eq!(
        output.status.code(),
        Some(1),
        "a bad line makes the exit code 1"
    );
    let answers = stdout_lines(&output);
    assert_eq!(answers.len(), lines.len(), "one answer per line");
    let mut good = scenarios.iter().map(|(_, e)| e);
    for (i, answer) in answers.iter().enumerate() {
        let line_no = i + 1;
        match line_no {
            3 | 5 | 7 | 9 => {
                assert_eq!(answer["line"], line_no, "{answer}");
                let message = answer["error"].as_str().expect("an error message");
                let needle = match line_no {
                    5 => "max_load_skew",
                    7 => "colour",
                    9 => "http://elsewhere:1",
                    _ => "",
                };
                assert!(message.contains(needle), "line {line_no}: {message}");
            }
            _ => assert_eq!(Some(answer), good.next(), "line {line_no}"),
        }
    }
}

#[test]
fn explain_batch_answers_ten_thousand_lines() {
    let scenarios = golden_scenarios();
    let n = 10_000;
    let input: String = (0..n)
        .map(|i| format!("{}\n", scenarios[i % scenarios.len()].0))
        .collect();
    let mut command = gatewayd();
    command.args(["explain", "--batch"]);
    let started = Instant::now();
    let output = run_with_stdin(command, input);
    let elapsed = started.elapsed();
    eprintln!(
        "explain --batch: {n} lines in {elapsed:.2?} ({:.0} lines/s, this build profile)",
        n as f64 / elapsed.as_secs_f64()
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answers = stdout_lines(&output);
    assert_eq!(answers.len(), n);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer, &scenarios[i % scenarios.len()].1, "line {}", i + 1);
    }
}

/// The answer for `key` over workers `a`, `b`, `c` with `extra` flags.
fn explain_full(key: &[&str], extra: &[&str]) -> Value {
    let mut command = gatewayd();
    command.arg("explain");
    for w in ["http://a:1", "http://b:1", "http://c:1"] {
        command.args(["--worker", w]);
    }
    let output = command.args(key).args(extra).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// With caps and saturated engines given as flags, explain says where a key goes when its worker
/// is full: an explicit key moves at once, an implicit one waits for its worker, and with every
/// worker full the explicit key waits for any.
#[test]
fn explain_answers_for_full_workers() {
    let explicit = ["--routing-key", "tenant-1"];
    let free = explain_full(&explicit, &[]);
    let preferred = free["worker"].as_str().unwrap().to_owned();
    let cap = ["--max-in-flight-per-worker", "2"];
    let at_cap = format!("{preferred}=2");

    let moved = explain_full(&explicit, &[&cap[..], &["--load", &at_cap]].concat());
    assert_eq!(
        moved["branch"], "explicit_routing_key_capacity_spill",
        "{moved}"
    );
    assert_eq!(moved["preferred"], preferred.as_str());
    assert_ne!(moved["worker"], preferred.as_str(), "{moved}");
    assert!(moved.get("wait").is_none(), "{moved}");

    // The same key as an implicit one waits for its worker; a per-worker cap alone does it too.
    let own_cap = format!("{preferred}=2");
    let implicit = [
        "--routing-key",
        "tenant-1",
        "--implicit",
        "--max-in-flight",
        &own_cap,
        "--load",
        &at_cap,
    ];
    let held = explain_full(&implicit, &[]);
    assert_eq!(held["branch"], "implicit_routing_key_full", "{held}");
    assert!(held["worker"].is_null(), "{held}");
    assert_eq!(held["wait"], json!({"for_worker": preferred}));

    // Every engine saturated: the explicit key waits for any worker with room.
    let all_full = [
        "--engine-full",
        "http://a:1",
        "--engine-full",
        "http://b:1",
        "--engine-full",
        "http://c:1",
    ];
    let waits = explain_full(&explicit, &all_full);
    assert_eq!(waits["branch"], "fleet_full", "{waits}");
    assert_eq!(waits["wait"], "for_any_worker", "{waits}");
}

/// A `--batch` line whose request would wait says for what; other lines keep their two fields.
#[test]
fn explain_batch_lines_say_what_a_request_waits_for() {
    let workers = r#"["http://a:1","http://b:1"]"#;
    let input = format!(
        "{{\"workers\":{workers},\"routing_key\":\"k\",\"explicit\":true}}\n\
         {{\"workers\":{workers},\"routing_key\":\"k\",\"explicit\":true,\
         \"engine_full\":{{\"http://a:1\":true,\"http://b:1\":true}}}}\n"
    );
    let mut command = gatewayd();
    command.args(["explain", "--batch"]);
    let output = run_with_stdin(command, input);
    assert!(output.status.success());
    let answers = stdout_lines(&output);
    assert_eq!(answers[0].as_object().unwrap().len(), 2, "{}", answers[0]);
    assert_eq!(
        answers[1],
        json!({"worker": null, "branch": "fleet_full", "wait": "for_any_worker"})
    );
}

/// `--serves URL=MODEL` and `--model`: the answer is a one-model fleet's over the workers that
/// serve the model (the other model's heavy load does not count in the bound), names the model,
/// and a fleet with models but no `--model`, or a model no worker serves, is refused with exit 1.
#[test]
fn explain_decides_in_the_model_pool() {
    let run = |args: &[&str]| {
        let mut command = gatewayd();
        command.arg("explain");
        for w in ["http://a:1", "http://b:1", "http://c:1", "http://d:1"] {
            command.args(["--worker", w]);
        }
        command.args(["--routing-key", "k"]).args(args);
        command.output().unwrap()
    };
    let serves = [
        "--serves",
        "http://a:1=m1",
        "--serves",
        "http://b:1=m1",
        "--serves",
        "http://c:1=m2",
        "--serves",
        "http://d:1=m2",
        "--load",
        "http://a:1=40",
        "--load",
        "http://b:1=40",
    ];
    let output = run(&[&serves[..], &["--model", "m2"]].concat());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["model"], "m2", "{answer}");
    assert!(
        ["http://c:1", "http://d:1"].contains(&answer["worker"].as_str().unwrap()),
        "{answer}"
    );
    assert_eq!(answer["branch"], "explicit_routing_key_hit", "{answer}");
    assert_eq!(
        answer["bound"]["mean_load"], 0.0,
        "m1's load is not m2's: {answer}"
    );
    let missing = run(&serves);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("model"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    let unknown = run(&[&serves[..], &["--model", "m3"]].concat());
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("m3"));
}
