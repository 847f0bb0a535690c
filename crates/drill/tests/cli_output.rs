//! The `bch-drill` binary when its output cannot be written: stdout or stderr a pipe whose reader
//! is gone (`bch-drill storm ... | head -1`), or a report file in a folder that does not exist. Each
//! is a clear error and exit status 1, never a panic, and one failed output never costs the other.
//! Also the outputs of an open-loop storm (its records file) and of a sweep (a line per step).

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};

use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_worker};

async fn worker() -> WorkerHandle {
    spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "w",
        SimConfig::default().with_time_scale(0.0),
    )
    .await
    .unwrap()
}

/// `bch-drill storm --gateway gateway` with every output piped and no control plane from the
/// environment; `--out out` and small prompts (16 prefix tokens, 2 answer tokens, seed 1) when
/// `out` is given, so a run writes a report quickly.
fn storm_command(gateway: &str, out: Option<&std::path::Path>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_bch-drill"));
    command
        .args(["storm", "--gateway", gateway])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("BCH_CONTROL");
    if let Some(out) = out {
        command
            .args([
                "--prefix-tokens",
                "16",
                "--max-tokens",
                "2",
                "--seed",
                "1",
                "--out",
            ])
            .arg(out);
    }
    command
}

/// Runs `command` to its end on a blocking thread (the test's runtime keeps serving the worker)
/// and answers its output.
async fn output_of(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Runs a small storm at `gateway` with `--out out`; with `close_stdout` the pipe's reader is
/// dropped before the binary writes anything.
async fn storm(gateway: String, out: std::path::PathBuf, close_stdout: bool) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = storm_command(&gateway, Some(&out))
            .args(["--groups", "2", "--siblings", "2"])
            .spawn()
            .unwrap();
        if close_stdout {
            // The only reader of the pipe: from here on every write to stdout fails with EPIPE.
            drop(child.stdout.take());
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_closed_stdout_is_an_error_and_the_report_file_is_still_written() {
    let w = worker().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("storm.json");
    let output = storm(w.url(), out.clone(), true).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("bch-drill: error: writing the report to standard output"),
        "{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("the report file")).unwrap();
    assert_eq!(report["requests"], 4);
}

#[tokio::test]
async fn a_report_file_that_cannot_be_written_is_an_error_and_the_report_is_still_printed() {
    let w = worker().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("missing").join("storm.json");
    let output = storm(w.url(), out.clone(), false).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("bch-drill: error: writing {}", out.display())),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("storm: 4 requests"), "{stdout}");
}

#[tokio::test]
async fn an_error_with_a_closed_stderr_is_still_exit_status_1() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let output = tokio::task::spawn_blocking(move || {
        let mut child = storm_command(&dead, None).spawn().unwrap();
        // The only reader of stderr: the error line cannot be written.
        drop(child.stderr.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    // 101 would be a panic: `eprintln!` on the broken stderr.
    assert_eq!(output.status.code(), Some(1));
}

#[tokio::test]
async fn ctrl_c_mid_storm_still_prints_and_writes_the_report_of_the_requests_started() {
    let w = worker().await;
    // Every request hangs before its first byte: the storm is mid-flight until interrupted.
    w.set_fault(bch_drill::worker::Fault::StallFirstByte);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("storm.json");
    let child = storm_command(&w.url(), Some(&out))
        .args(["--groups", "5", "--siblings", "2", "--concurrency", "2"])
        .spawn()
        .unwrap();
    // Two groups of two in flight, all four stalled at the worker.
    while w.stats().requests_total < 4 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // 130 = 128 + SIGINT, as a shell reports an interrupted command; the report comes first.
    assert_eq!(output.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("storm: 4 requests"), "{stdout}");
    assert!(stdout.contains("ok: 0, interrupted: 4"), "{stdout}");
    assert!(stdout.contains("INTERRUPTED"), "{stdout}");
    assert!(stderr.contains("bch-drill: error: interrupted"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("the report file")).unwrap();
    assert_eq!(report["requests"], 4);
    assert_eq!(report["outcomes"]["interrupted"], 4);
    assert_eq!(report["interrupted"], true);
}

/// `--rate` with `--records` writes one JSON line per request beside the report, and a sweep
/// prints a line per step and the estimate.
#[tokio::test]
async fn an_open_loop_storm_writes_its_records_and_a_sweep_prints_its_steps() {
    let w = worker().await;
    let dir = tempfile::tempdir().unwrap();
    let (out, records) = (dir.path().join("storm.json"), dir.path().join("r.jsonl"));
    let mut open_loop = storm_command(&w.url(), Some(&out));
    open_loop
        .args(["--rate", "40", "--arrival", "constant", "--duration", "0.5"])
        .args(["--slo-ttft-ms", "1000", "--records"])
        .arg(&records);
    let output = output_of(open_loop).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("answers       200 20   503+Retry-After 0"),
        "{stdout}"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    assert!(
        lines
            .iter()
            .all(|r| r["class"] == "ok" && r["late_ms"].is_number())
    );

    let url = w.url();
    let mut sweep = Command::new(env!("CARGO_BIN_EXE_bch-drill"));
    sweep
        .args(["sweep", "--gateway", &url, "--slo-ttft-ms", "1000"])
        .args(["--start-rate", "20", "--step", "20", "--max-steps", "2"])
        .args(["--arrival", "constant", "--duration", "0.25"])
        .args(["--prefix-tokens", "16", "--max-tokens", "2"])
        .env_remove("BCH_CONTROL");
    let output = output_of(sweep).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let steps: Vec<&str> = stdout.lines().skip(1).take(2).collect();
    assert!(steps[0].trim_start().starts_with("20.0"), "{stdout}");
    assert!(steps[1].trim_start().starts_with("40.0"), "{stdout}");
    assert!(
        stdout.contains("stopped: reached the last step (2)"),
        "{stdout}"
    );
}
