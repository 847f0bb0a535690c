//! The real `gatewayd` binary: `check-config`, `explain` (one scenario from flags, and `--batch`
//! against the golden bounded-policy vectors, with bad lines and 10,000 lines), and the daemon
//! itself: flags over the file, SIGHUP reload and SIGTERM shutdown.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn gatewayd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gatewayd"));
    // Keep the environment from changing what the flags say.
    for var in [
        "GATEWAYD_CONFIG",
        "GATEWAYD_LISTEN",
        "GATEWAYD_CONTROL_LISTEN",
        "GATEWAYD_ADMIN_TOKEN_FILE",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file in the temp dir with a unique name, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &str) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "bch-cli-test-{}-{}.toml",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `command` with `stdin` written from another thread (so a full stdout pipe cannot
/// deadlock the test) and returns its output.
fn run_with_stdin(mut command: Command, stdin: String) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gatewayd runs");
    let mut pipe = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        pipe.write_all(stdin.as_bytes()).unwrap();
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    output
}

fn stdout_lines(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// check-config

#[test]
fn check_config_accepts_every_shipped_file() {
    for name in ["gatewayd.toml", "llama-cpp.toml", "demo.toml"] {
        let file = workspace().join("config").join(name);
        let output = gatewayd().arg("check-config").arg(&file).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("ok"), "{stdout}");
        // The summary names the load signal, the setting that differs between replicas most.
        assert!(stdout.contains(", load_source "), "{stdout}");
    }
}

#[test]
fn check_config_rejects_bad_files_naming_the_field_or_line() {
    let cases = [
        ("[policy]\nmax_load_skew = 0.5\n", "policy.max_load_skew"),
        ("[policy]\nmax_load_skew = nan\n", "policy.max_load_skew"),
        ("[policy]\nmin_load_gap = -1\n", "min_load_gap"),
        ("[policy]\nkind = \"strict\"\n", "kind"),
        ("[server]\nlisten = \"nowhere\"\n", "listen"),
        ("[health]\ninterval_ms = 0\n", "health.interval_ms"),
        ("[log]\nlevels = \"debug\"\n", "levels"),
        ("[[workers]]\nurl = \"not a url\"\n", "workers[0].url"),
        (
            "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:2\"\n",
            "workers[1].name",
        ),
        ("[server]\nlisten = \"127.0.0.1:1\"\n\n[policy\n", "line 4"),
        (
            "[[workers]]\nurl = \"http://127.0.0.1:0\"\n",
            "workers[0].url",
        ),
        (
            "[[workers]]\nurl = \"http://127.0.0.1:99999\"\n",
            "workers[0].url",
        ),
        (
            "[[workers]]\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nurl = \"HTTP://LOCALHOST:1/\"\n",
            "workers[1].url",
        ),
    ];
    for (text, needle) in cases {
        let file = TempFile::new(text);
        let output = gatewayd()
            .arg("check-config")
            .arg(file.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{text}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{text}: {stderr:?} lacks {needle}");
        assert!(
            stderr.contains(&*file.path().to_string_lossy()),
            "{stderr:?} names the file"
        );
    }
    let output = gatewayd()
        .args(["check-config", "/nonexistent/bch/gatewayd.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}

/// A worker URL with credentials is refused by the file check and by `--worker`, naming the field
/// and never printing the password.
#[test]
fn credentials_in_worker_urls_are_refused_without_being_printed() {
    let url = "http://operator:pa55-w0rd@127.0.0.1:1";
    let file = TempFile::new(&format!("[[workers]]\nurl = \"{url}\"\n"));
    let checked = gatewayd()
        .arg("check-config")
        .arg(file.path())
        .output()
        .unwrap();
    let served = gatewayd()
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
        .args(["--worker", url])
        .output()
        .unwrap();
    for output in [checked, served] {
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("workers[0].url"), "{stderr}");
        assert!(stderr.contains("credentials"), "{stderr}");
        assert!(!stderr.contains("pa55-w0rd"), "{stderr}");
        assert!(
            output.stdout.is_empty() || !String::from_utf8_lossy(&output.stdout).contains("pa55")
        );
    }
}

/// `check-config FILE`: exit status, stdout, stderr.
fn check(file: &Path) -> (Option<i32>, String, String) {
    let output = gatewayd().arg("check-config").arg(file).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_config_runs_every_start_up_check_and_reports_every_problem() {
    // Three problems at once: a bad value, listeners on one port, an open control plane beyond
    // loopback. Each used to pass check-config (or all but the first went unreported) and then
    // refused to start.
    let file = TempFile::new(
        "[server]\nlisten = \"127.0.0.1:9100\"\ncontrol_listen = \"0.0.0.0:9100\"\n\n[policy]\nmax_load_skew = 0.5\n\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n",
    );
    let (code, _, stderr) = check(file.path());
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(errors[0].contains("policy.max_load_skew"), "{stderr}");
    assert!(
        errors[1].contains("server.control_listen") && errors[1].contains("9100"),
        "{stderr}"
    );
    assert!(errors[2].contains("without a token"), "{stderr}");
    // The daemon refuses the same file with the same problems.
    let output = gatewayd()
        .arg("--config")
        .arg(file.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let started = String::from_utf8_lossy(&output.stderr);
    assert!(started.contains("3 problems"), "{started}");
    for error in &errors {
        assert!(
            started.contains(error.trim_start_matches("error: ")),
            "{started}"
        );
    }

    // Token files: missing, empty.
    let empty = TempFile::new("  \n");
    for (token, needle) in [
        (
            "/nonexistent/bch/admin.token".to_owned(),
            "cannot read admin_token_file",
        ),
        (empty.path().display().to_string(), "is empty"),
    ] {
        let file = TempFile::new(&format!(
            "[server]\nadmin_token_file = \"{token}\"\n\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n"
        ));
        let (code, _, stderr) = check(file.path());
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }

    // A duplicate name the user never wrote is reported under the URLs they did write.
    let file = TempFile::new(
        "[[workers]]\nurl = \"http://h:8000\"\n\n[[workers]]\nurl = \"http://h:8000/\"\n",
    );
    let (code, _, stderr) = check(file.path());
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("workers[1].url: \"http://h:8000/\" gets the default name \"h:8000\", already the name of workers[0] (\"http://h:8000\")"),
        "{stderr}"
    );

    // No workers: fine, but said.
    let file = TempFile::new("[policy]\nmin_load_gap = 3\n");
    let (code, stdout, stderr) = check(file.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("ok (0 workers"), "{stdout}");
    assert!(
        stderr.starts_with("warning: no workers configured"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// explain

fn golden() -> Value {
    serde_json::from_str(include_str!(
        "../../core/tests/fixtures/bounded_decisions.json"
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

// ---------------------------------------------------------------------------------------------
// The daemon

/// A running `gatewayd`, killed on drop if the test did not stop it.
struct Daemon {
    child: std::process::Child,
    data: String,
    control: String,
    stderr: std::sync::mpsc::Receiver<String>,
    /// The fields of the JSON `gatewayd started` line (JSON log mode only).
    started: Option<Value>,
    /// Every stderr line read so far, in order.
    seen: Vec<String>,
}

impl Daemon {
    fn spawn(mut command: Command) -> Daemon {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("gatewayd runs");
        let (tx, stderr) = std::sync::mpsc::channel();
        let pipe = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in pipe.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut daemon = Daemon {
            child,
            data: String::new(),
            control: String::new(),
            stderr,
            started: None,
            seen: Vec::new(),
        };
        // The banner names the bound addresses (the test binds port 0); the demo's banner puts
        // them on lines of their own; in JSON mode the `gatewayd started` line carries them as
        // `data_plane` and `control_plane`.
        let address_after = |line: &str, label: &str| {
            let rest = line.split(label).nth(1)?;
            let rest = rest.split("http://").nth(1)?;
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '"')
                .unwrap_or(rest.len());
            Some(rest[..end].to_owned())
        };
        while daemon.data.is_empty() || daemon.control.is_empty() {
            let line = daemon.wait_for_stderr("plane");
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                daemon.started = Some(value["fields"].clone());
            }
            let line = line
                .replace("data_plane", "data plane")
                .replace("control_plane", "control plane");
            if let Some(address) = address_after(&line, "data plane") {
                daemon.data = address;
            }
            if let Some(address) = address_after(&line, "control plane") {
                daemon.control = address;
            }
        }
        daemon
    }

    fn wait_for_stderr(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    // stderr is a pipe here, as under systemd: no terminal colour codes.
                    assert!(
                        !line.contains('\x1b'),
                        "ANSI escapes in a piped log: {line:?}"
                    );
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no {needle:?} on gatewayd's stderr: {e}"),
            }
        }
    }

    /// `GET path` on the control plane; the body.
    fn get(&self, path: &str) -> String {
        let (status, body) = exchange(&self.control, &format!("GET {path} HTTP/1.1\r\n"), "");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `POST path` (empty body) on the control plane; the status.
    fn post(&self, path: &str) -> u16 {
        exchange(&self.control, &format!("POST {path} HTTP/1.1\r\n"), "").0
    }

    fn get_json(&self, path: &str) -> Value {
        serde_json::from_str(&self.get(path)).unwrap()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Every line the process wrote to stderr, once it has exited (after [`Daemon::wait`]).
    fn all_stderr(mut self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                // The reader thread ends at the pipe's end: everything was read.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return std::mem::take(&mut self.seen);
                }
                Err(e) => panic!("gatewayd's stderr did not end: {e}"),
            }
        }
    }

    /// Waits (bounded) for the process to exit.
    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "gatewayd did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 exchange on a fresh connection: `head` is the request line plus any header lines
/// (each ending in CRLF); `Host`, `Connection: close` and the body's length are added. Answers
/// the status and the body.
fn exchange(address: &str, head: &str, body: &str) -> (u16, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "{head}host: localhost\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    (
        status,
        response.split_once("\r\n\r\n").unwrap().1.to_owned(),
    )
}

fn daemon_config(gap: u64, skew: f64, workers: &[&str]) -> String {
    let mut text = format!(
        "[policy]\nkind = \"bounded_consistent_hashing\"\nmin_load_gap = {gap}\nmax_load_skew = {skew:?}\n\n[server]\nshutdown_grace_ms = 1000\n"
    );
    for url in workers {
        text.push_str(&format!("\n[[workers]]\nurl = \"{url}\"\n"));
    }
    text
}

#[test]
fn flags_override_the_file_also_after_a_sighup_reload_and_sigterm_stops() {
    let file = TempFile::new(&daemon_config(2, 1.5, &["http://127.0.0.1:9"]));
    let mut command = gatewayd();
    command
        .env("GATEWAYD_CONFIG", file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
        .args(["--min-load-gap", "5", "--worker", "http://127.0.0.1:10"]);
    let mut daemon = Daemon::spawn(command);
    let policy = daemon.get_json("/admin/policy");
    assert_eq!(
        policy["kind"], "bounded_consistent_hashing",
        "from the file"
    );
    assert_eq!(policy["min_load_gap"], 5, "the flag wins over the file");
    assert_eq!(policy["max_load_skew"], 1.5);
    let names = |daemon: &Daemon| -> Vec<String> {
        daemon.get_json("/admin/workers")["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["url"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&daemon),
        ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    );

    // Edit the file and SIGHUP: the file's changes apply, the flags still win.
    std::fs::write(
        file.path(),
        daemon_config(3, 2.5, &["http://127.0.0.1:9", "http://127.0.0.1:11"]),
    )
    .unwrap();
    daemon.signal("HUP");
    daemon.wait_for_stderr("configuration reloaded");
    let policy = daemon.get_json("/admin/policy");
    assert_eq!(policy["max_load_skew"], 2.5, "from the edited file");
    assert_eq!(
        policy["min_load_gap"], 5,
        "the flag still wins after a reload"
    );
    assert_eq!(
        names(&daemon),
        [
            "http://127.0.0.1:9",
            "http://127.0.0.1:11",
            "http://127.0.0.1:10"
        ]
    );

    // A bad file on SIGHUP is logged and changes nothing.
    std::fs::write(file.path(), "[policy]\nmax_load_skew = 0.5\n").unwrap();
    daemon.signal("HUP");
    let logged = daemon.wait_for_stderr("reload failed");
    assert!(logged.contains("policy.max_load_skew"), "{logged}");
    assert_eq!(daemon.get_json("/admin/policy")["max_load_skew"], 2.5);

    daemon.signal("TERM");
    daemon.wait_for_stderr("shutting down");
    let status = daemon.wait();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_sighup_right_after_start_up_reloads_instead_of_killing() {
    // The banner promises the daemon is up; a reload sent the moment it appears (systemd's
    // ExecReload can do that) must find the handler installed, not SIGHUP's default: terminate.
    for _ in 0..5 {
        let file = TempFile::new(&daemon_config(2, 1.5, &[]));
        let mut command = gatewayd();
        command.arg("--config").arg(file.path()).args([
            "--listen",
            "127.0.0.1:0",
            "--control-listen",
            "127.0.0.1:0",
        ]);
        let mut daemon = Daemon::spawn(command);
        daemon.signal("HUP");
        daemon.wait_for_stderr("configuration reloaded");
        assert_eq!(daemon.get_json("/admin/policy")["min_load_gap"], 2);
        daemon.signal("TERM");
        assert!(daemon.wait().success());
    }
}

#[test]
fn demo_workers_survive_a_sighup_and_an_http_reload() {
    let file = TempFile::new(&daemon_config(2, 1.5, &["http://127.0.0.1:9"]));
    let mut command = gatewayd();
    command
        .args(["--demo", "--demo-workers", "2", "--config"])
        .arg(file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"]);
    let mut daemon = Daemon::spawn(command);
    let names = |daemon: &Daemon| -> Vec<String> {
        daemon.get_json("/admin/workers")["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let at_start = names(&daemon);
    assert_eq!(
        at_start.len(),
        3,
        "the file's worker and two simulated ones: {at_start:?}"
    );
    assert_eq!(at_start[0], "127.0.0.1:9");

    daemon.signal("HUP");
    daemon.wait_for_stderr("configuration reloaded");
    assert_eq!(
        names(&daemon),
        at_start,
        "SIGHUP keeps the simulated workers"
    );

    assert_eq!(daemon.post("/admin/reload"), 200);
    assert_eq!(
        names(&daemon),
        at_start,
        "POST /admin/reload keeps them too"
    );

    daemon.signal("TERM");
    assert!(daemon.wait().success());
}

#[test]
fn the_demo_keeps_its_banner_readable_and_its_warnings_visible() {
    // A pinned worker nobody serves: its failed first probe is a warning the demo must still show.
    let file = TempFile::new(&daemon_config(2, 1.5, &["http://127.0.0.1:9"]));
    let mut command = gatewayd();
    command
        .args(["--demo", "--demo-workers", "2", "--config"])
        .arg(file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"]);
    let mut daemon = Daemon::spawn(command);
    // The storm's requests are served and ended (the duration is observed as each request's
    // access-log line is written) before the daemon stops.
    let deadline = Instant::now() + Duration::from_secs(20);
    let served = |daemon: &Daemon| -> f64 {
        let metrics = daemon.get("/metrics");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("bch_request_duration_seconds_count "))
            .map_or(0.0, |n| n.trim().parse().unwrap())
    };
    while served(&daemon) < 20.0 {
        assert!(
            Instant::now() < deadline,
            "the demo's storm sent no requests"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.signal("TERM");
    assert!(daemon.wait().success());
    let lines = daemon.all_stderr();
    let text = lines.join("\n");
    assert!(text.contains("bch demo: 2 simulated workers"), "{text}");
    assert!(
        text.contains("WARN") && text.contains("127.0.0.1:9"),
        "the demo's warnings still show: {text}"
    );
    let requests: Vec<&String> = lines.iter().filter(|l| l.contains("request_id=")).collect();
    assert!(
        requests.is_empty(),
        "{} access-log lines bury the banner, the first: {:?}",
        requests.len(),
        requests[0]
    );
}

/// The access log's request lines (JSON log format) seen on stderr until `count` of them came.
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
    let raw = raw_exchange(&daemon.data, "GET /v1/models HTTP/1.1\r\n", "");
    let id = raw
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

/// One HTTP/1.1 exchange, answered as the raw response text (head and body).
fn raw_exchange(address: &str, head: &str, body: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "{head}host: localhost\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

// ---------------------------------------------------------------------------------------------
// gatewayd reload

/// `gatewayd reload ARGS`: exit status, stdout, stderr.
fn reload_command(args: &[&str], config: &Path) -> (Option<i32>, String, String) {
    let output = gatewayd()
        .arg("reload")
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("GATEWAYD_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn gatewayd_reload_fails_when_the_reload_fails() {
    let token = TempFile::new("reload-test-token\n");
    let with_token = |gap: u64, skew: f64| {
        format!(
            "[server]\nadmin_token_file = \"{}\"\nshutdown_grace_ms = 1000\n\n[policy]\nkind = \"bounded_consistent_hashing\"\nmin_load_gap = {gap}\nmax_load_skew = {skew:?}\n",
            token.path().display(),
        )
    };
    let file = TempFile::new(&with_token(2, 1.5));
    let mut command = gatewayd();
    command.arg("--config").arg(file.path()).args([
        "--listen",
        "127.0.0.1:0",
        "--control-listen",
        "127.0.0.1:0",
    ]);
    let mut daemon = Daemon::spawn(command);
    let control = format!("http://{}", daemon.control);

    // A good file: exit 0. The token comes from the file's admin_token_file.
    std::fs::write(file.path(), with_token(3, 1.5)).unwrap();
    let (code, stdout, stderr) = reload_command(&["--control", &control], file.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("reloaded: policy bounded_consistent_hashing"),
        "{stdout}"
    );
    daemon.wait_for_stderr("configuration reloaded");

    // A bad file: the gateway keeps its configuration and `gatewayd reload` exits 1 saying why
    // (kill -HUP would have exited 0).
    std::fs::write(
        file.path(),
        with_token(3, 1.5).replace("max_load_skew = 1.5", "max_load_skew = 0.5"),
    )
    .unwrap();
    let (code, _, stderr) = reload_command(&["--control", &control], file.path());
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("reload failed") && stderr.contains("policy.max_load_skew"),
        "{stderr}"
    );

    // A wrong token, and nobody listening: exit 1 too.
    let wrong = TempFile::new("not-the-token\n");
    let wrong_path = wrong.path().display().to_string();
    let (code, _, stderr) = reload_command(
        &["--control", &control, "--token-file", &wrong_path],
        file.path(),
    );
    assert_eq!(code, Some(1));
    assert!(stderr.contains("401"), "{stderr}");
    let (code, _, stderr) = reload_command(&["--control", "http://127.0.0.1:9"], file.path());
    assert_eq!(code, Some(1));
    assert!(stderr.contains("cannot reach"), "{stderr}");

    daemon.signal("TERM");
    assert!(daemon.wait().success());
}

#[test]
fn connections_refused_at_the_cap_are_logged_without_flooding() {
    let file = TempFile::new(&format!(
        "{}\nmax_connections = 1\n",
        daemon_config(2, 1.5, &[]).trim_end()
    ));
    let mut command = gatewayd();
    command.arg("--config").arg(file.path()).args([
        "--listen",
        "127.0.0.1:0",
        "--control-listen",
        "127.0.0.1:0",
    ]);
    let mut daemon = Daemon::spawn(command);
    // One connection holds the only slot (it sends nothing); the next ones are refused with a
    // raw 503 that no request line records.
    let _held = std::net::TcpStream::connect(&daemon.data).unwrap();
    let mut refused = Vec::new();
    for _ in 0..3 {
        use std::io::Read;
        let mut stream = std::net::TcpStream::connect(&daemon.data).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        refused.push(answer);
    }
    assert!(
        refused.iter().all(|a| a.starts_with("HTTP/1.1 503")),
        "{refused:?}"
    );
    let line = daemon.wait_for_stderr("connections refused at max_connections");
    assert!(line.contains("max_connections=1"), "{line}");
    daemon.signal("TERM");
    assert!(daemon.wait().success());
    // Three refusals within a second: one line, not three.
    let more = daemon
        .stderr
        .try_iter()
        .filter(|l| l.contains("connections refused at max_connections"))
        .count();
    assert_eq!(more, 0, "one line per second at most");
}

#[test]
fn envoy_config_takes_the_file_refuses_unaddressable_workers_and_warns_about_discovery() {
    let envoy_config = |file: &TempFile| {
        let mut command = gatewayd();
        command.args([
            "envoy-config",
            "--listen",
            "127.0.0.1:10000",
            "--picker",
            "127.0.0.1:9002",
        ]);
        command.arg("--config").arg(file.path());
        command.output().unwrap()
    };
    let named = TempFile::new(
        "[[workers]]\nurl = \"http://127.0.0.1:8101\"\n[[workers]]\nname = \"gpu-1\"\nurl = \"http://gpu-1.internal:8000\"\n",
    );
    let out = envoy_config(&named);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("workers[1].url: worker gpu-1"), "{stderr}");
    assert!(out.stdout.is_empty());

    let discovered = TempFile::new(
        "[picker]\nfallbacks = 3\n[[workers]]\nurl = \"http://127.0.0.1:8101\"\n[[discovery]]\ndns = \"_http._tcp.llm.example\"\n",
    );
    let out = envoy_config(&discovered);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("_http._tcp.llm.example"), "{stderr}");
    assert!(stderr.contains("not in the generated cluster"), "{stderr}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("socket_address: { address: \"127.0.0.1\", port_value: 8101 }"));
    assert!(
        yaml.contains("num_retries: 3"),
        "[picker] fallbacks sets Envoy's retries"
    );
}
