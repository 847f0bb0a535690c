//! The real `gatewayd` binary: `check-config`, `explain` (one scenario from flags, and `--batch`
//! against the golden bounded-policy vectors, with bad lines and 10,000 lines), and the daemon
//! itself: flags over the file, SIGHUP reload and SIGTERM shutdown, its logs, `gatewayd reload`
//! and `envoy-config`; DNS discovery from the command line; and three replicas as a fleet.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/dnsmasq.rs"]
mod dnsmasq;

mod check_config;
mod commands;
mod demo;
mod discovery;
mod explain;
mod logs;
mod reload_tls;
mod replicas;
mod replicas_admission;
mod signals;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::raw;
use serde_json::Value;

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
    /// The thread that reads stderr; it ends, closing the pipe, at the first line it cannot pass on.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// `gatewayd --config FILE` on ports the system picks.
    fn with_config(file: &Path) -> Daemon {
        let mut command = gatewayd();
        command.arg("--config").arg(file).args([
            "--listen",
            "127.0.0.1:0",
            "--control-listen",
            "127.0.0.1:0",
        ]);
        Daemon::spawn(command)
    }

    fn spawn(mut command: Command) -> Daemon {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("gatewayd runs");
        let (tx, stderr) = std::sync::mpsc::channel();
        let pipe = BufReader::new(child.stderr.take().unwrap());
        let reader = std::thread::spawn(move || {
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
            reader: Some(reader),
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
                if value["fields"]["data_plane"] == "-" {
                    // Picker-only: no data plane to find.
                    daemon.data = "-".to_owned();
                }
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

    /// Stops listening to stderr, as a log sink that goes away does: the reading end of the pipe
    /// closes when the returned reader thread ends, at the next line the process writes.
    fn close_stderr(&mut self) -> std::thread::JoinHandle<()> {
        self.stderr = std::sync::mpsc::channel().1;
        self.reader.take().expect("stderr is still read")
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

/// One request on a fresh connection (`head` plus the framing headers, then `body`); the
/// status and body of the complete answer.
fn exchange(address: &str, head: &str, body: &str) -> (u16, String) {
    raw::exchange_blocking(address, raw::closing_request(head, body).as_bytes()).complete()
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
