//! What the daemon logs: refused and failed requests once each, JSON log mode, the start-up line.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

fn request_lines(daemon: &mut Daemon, count: usize) -> Vec<Value> {
    let mut lines = Vec::new();
    while lines.len() < count {
        let line = daemon.wait_for_stderr("\"message\":\"request\"");
        lines.push(serde_json::from_str::<Value>(&line).expect("JSON log lines")["fields"].clone());
    }
    lines
}

#[test]
fn refused_and_failed_requests_are_logged_once_and_timed_with_their_status() {
    let file = TempFile::new(
        "[server]\nmax_body_bytes = 16\n\n[health]\ninterval_ms = 60000\nwait_for_first_probe = false\n\n[[workers]]\nname = \"dead\"\nurl = \"http://127.0.0.1:9\"\n",
    );
    let mut command = gatewayd();
    command
        .arg("--config")
        .arg(file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"]);
    let mut daemon = Daemon::spawn(command);
    let too_large = exchange(
        &daemon.data,
        "POST /v1/completions HTTP/1.1\r\n",
        &"x".repeat(17),
    );
    assert_eq!(too_large.0, 413, "{}", too_large.1);
    let miss = exchange(
        &daemon.data,
        "GET /v1/models HTTP/1.1\r\nx-smg-target-worker: nobody\r\n",
        "",
    );
    assert_eq!(miss.0, 503, "{}", miss.1);
    // Nothing listens on port 9: the connect fails and there is no other worker to retry on.
    let unreachable = exchange(
        &daemon.data,
        "GET /v1/models HTTP/1.1\r\nx-smg-routing-key: k\r\n",
        "",
    );
    assert_eq!(unreachable.0, 502, "{}", unreachable.1);

    let lines = request_lines(&mut daemon, 3);
    let statuses: Vec<u64> = lines
        .iter()
        .map(|l| l["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [413, 503, 502], "{lines:?}");
    assert_eq!(lines[0]["branch"], "-", "refused before routing");
    assert_eq!(lines[1]["branch"], "target_worker_miss");
    assert_eq!(lines[2]["worker"], "dead");
    assert_eq!(lines[2]["error"], true);
    let metrics = daemon.get("/metrics");
    let count = metrics
        .lines()
        .find_map(|l| l.strip_prefix("bch_request_duration_seconds_count "))
        .expect("the duration histogram");
    assert_eq!(count.trim(), "3", "every request timed once");

    daemon.signal("TERM");
    assert!(daemon.wait().success());
    // Exactly once: no second line for any of them came before the process ended.
    let extra: Vec<String> = daemon
        .stderr
        .try_iter()
        .filter(|l| l.contains("\"message\":\"request\""))
        .collect();
    assert!(extra.is_empty(), "{extra:?}");
}

/// A minimal worker in the test process: every request on every connection gets `200 ok` and the
/// connection is closed. Enough for probes and one proxied request.
fn tiny_worker() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                );
            });
        }
    });
    address
}

/// Reads stderr lines (each must be JSON) until one whose message is `message`; all of them.
fn json_lines_until(daemon: &mut Daemon, message: &str) -> Vec<Value> {
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = daemon
            .stderr
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no {message:?} line: {e}; got {lines:#?}"));
        let value: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("JSON log mode printed a non-JSON line {line:?}: {e}"));
        let done = value["fields"]["message"] == message;
        lines.push(value);
        if done {
            return lines;
        }
    }
}

#[test]
fn json_log_mode_prints_only_json_and_the_lines_say_who_what_and_how_long() {
    let live = tiny_worker();
    let file = TempFile::new(&format!(
        "[policy]\nmin_load_gap = 2\n\n[health]\ninterval_ms = 60000\nwait_for_first_probe = false\n\n[[workers]]\nname = \"dead\"\nurl = \"http://127.0.0.1:9\"\n\n[[workers]]\nname = \"live\"\nurl = \"http://{live}\"\n"
    ));
    let mut command = gatewayd();
    command
        .arg("--config")
        .arg(file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"]);
    let mut daemon = Daemon::spawn(command);
    let key = (0..1000)
        .map(|i| format!("k{i}"))
        .find(|k| {
            daemon.get_json(&format!("/admin/explain?routing_key={k}"))["preferred"] == "dead"
        })
        .expect("a key preferring the dead worker");

    // A request for the dead worker's key: the connect fails, it is retried on `live`; the
    // client's own request id is kept and returned.
    let (status, _) = exchange(
        &daemon.data,
        &format!(
            "POST /v1/chat/completions?secret=1 HTTP/1.1\r\nx-smg-routing-key: {key}\r\nx-request-id: client-id-1\r\n"
        ),
        "{}",
    );
    assert_eq!(status, 200);
    // Without an id of its own, the client gets the gateway's.
    let raw = raw::exchange_blocking(
        &daemon.data,
        raw::closing_request("GET /v1/models HTTP/1.1\r\n", "").as_bytes(),
    );
    raw.complete();
    let id = raw
        .text
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .expect("a request id on the answer")
        .trim()
        .to_owned();
    // A policy change names its client.
    let (status, _) = exchange(
        &daemon.control,
        "PUT /admin/policy HTTP/1.1\r\ncontent-type: application/json\r\n",
        r#"{"min_load_gap":3}"#,
    );
    assert_eq!(status, 200);
    // A reload logs what it changed (the file still says 2).
    assert_eq!(daemon.post("/admin/reload"), 200);

    let lines = json_lines_until(&mut daemon, "configuration reloaded");
    let fields = |message: &str| -> Vec<Value> {
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == message)
            .map(|l| l["fields"].clone())
            .collect()
    };
    let requests = fields("request");
    assert_eq!(requests.len(), 2, "{lines:#?}");
    let retried = &requests[0];
    assert_eq!(retried["request_id"], "client-id-1");
    assert_eq!(retried["method"], "POST");
    assert_eq!(
        retried["path"], "/v1/chat/completions",
        "the query is never logged"
    );
    assert_eq!(retried["worker"], "live");
    assert_eq!(retried["retried_from"], "dead");
    assert_eq!(retried["status"], 200);
    assert!(retried["ttfb_ms"].as_i64().unwrap() >= 0, "{retried}");
    assert!(retried["headers_ms"].as_i64().unwrap() >= 0, "{retried}");
    assert_eq!(requests[1]["request_id"], id.as_str());
    assert_eq!(requests[1]["retried_from"], "-");
    let changed = &fields("policy changed")[0];
    assert_eq!(changed["source"], "http");
    assert!(
        changed["client"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{changed}"
    );
    assert_eq!(changed["previous_min_load_gap"], 2);
    let reloaded = &fields("configuration reloaded")[0];
    assert_eq!(
        reloaded["changes"], "policy.min_load_gap 3 -> 2",
        "{reloaded}"
    );

    daemon.signal("TERM");
    assert!(daemon.wait().success());
    for line in daemon.stderr.try_iter() {
        assert!(
            serde_json::from_str::<Value>(&line).is_ok(),
            "non-JSON line {line:?}"
        );
    }

    // A configuration that does not start: still JSON only.
    let bad = TempFile::new("[policy]\nmax_load_skew = 0.5\n");
    let output = gatewayd()
        .arg("--config")
        .arg(bad.path())
        .args(["--log-format", "json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.trim().is_empty());
    let values: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect();
    let last = values.last().unwrap();
    assert_eq!(last["level"], "ERROR");
    assert!(
        last["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("max_load_skew"),
        "{stderr}"
    );
}

#[test]
fn the_start_up_line_summarises_what_runs() {
    let file = TempFile::new(&daemon_config(
        4,
        1.25,
        &["http://127.0.0.1:9", "http://127.0.0.1:10"],
    ));
    let mut command = gatewayd();
    command
        .arg("--config")
        .arg(file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"]);
    let mut daemon = Daemon::spawn(command);
    let started = daemon.started.clone().expect("a start-up line");
    assert_eq!(started["policy"], "bounded_consistent_hashing");
    assert_eq!(started["min_load_gap"], 4);
    assert_eq!(started["max_load_skew"], 1.25);
    assert_eq!(started["worker_count"], 2);
    assert_eq!(started["workers"], "127.0.0.1:9,127.0.0.1:10");
    assert_eq!(started["version"], env!("CARGO_PKG_VERSION"));
    daemon.signal("TERM");
    assert!(daemon.wait().success());
}

#[test]
fn a_picker_only_start_up_line_names_no_data_plane() {
    let file = TempFile::new(&daemon_config(2, 1.5, &["http://127.0.0.1:9"]));
    let mut command = gatewayd();
    command
        .arg("--config")
        .arg(file.path())
        .args(["--no-data-plane", "--picker-listen", "127.0.0.1:0"])
        .args(["--control-listen", "127.0.0.1:0", "--log-format", "json"]);
    let mut daemon = Daemon::spawn(command);
    let started = daemon.started.clone().expect("a start-up line");
    // It said `http://0.0.0.0:0`: an address nothing listens on, read by an operator following
    // the Envoy quick start as a data plane on every interface.
    assert_eq!(started["data_plane"], "-", "{started}");
    assert!(
        started["picker"]
            .as_str()
            .unwrap()
            .starts_with("grpc://127.0.0.1:"),
        "{started}"
    );
    daemon.signal("TERM");
    assert!(daemon.wait().success());
}

/// Text log mode (the default) with hostile input from a client: a routing key and a target worker
/// with a line separator and a bidirectional override (raw UTF-8, which HTTP carries as opaque
/// bytes), a request id with a quote and `=`. Each request is one access-log line; nothing raw reaches the
/// log, and the kept request id is quoted and escaped.
#[test]
fn hostile_client_text_stays_on_one_escaped_text_log_line() {
    let live = tiny_worker();
    let file = TempFile::new(&format!(
        "[health]\ninterval_ms = 60000\nwait_for_first_probe = false\n\n[[workers]]\nname = \"live\"\nurl = \"http://{live}\"\n"
    ));
    let mut daemon = Daemon::with_config(file.path());
    let hostile = "k\u{2028}2026-01-01T00:00:00Z INFO request status=200\u{202e}";
    let requests = [
        format!("GET /v1/models HTTP/1.1\r\nx-smg-routing-key: {hostile}\r\n"),
        "GET /v1/models HTTP/1.1\r\nx-request-id: id\"status=500\r\n".to_owned(),
        format!("GET /v1/models HTTP/1.1\r\nx-smg-target-worker: {hostile}\r\n"),
    ];
    for head in &requests {
        let reply = raw::exchange_blocking(&daemon.data, raw::closing_request(head, "").as_bytes());
        assert!(
            reply.text.starts_with("HTTP/1.1 "),
            "{head:?}: {}",
            reply.text
        );
    }
    let mut lines = Vec::new();
    while lines.len() < requests.len() {
        lines.push(daemon.wait_for_stderr("request_id="));
    }
    daemon.signal("TERM");
    assert!(daemon.wait().success());
    let all = daemon.all_stderr();
    for line in &all {
        assert!(
            !line.contains(['\u{2028}', '\u{202e}']),
            "a raw hostile character in {line:?}"
        );
    }
    assert_eq!(
        all.iter().filter(|l| l.contains("request_id=")).count(),
        requests.len(),
        "one line per request: {all:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(r#"request_id="id\"status=500""#)),
        "{lines:#?}"
    );
}
