//! The console's terminal going away: the real binary on a pseudo-terminal (Python's `pty`, the
//! one portable way to get one without a new dependency), stopped by its terminal hanging up or by
//! `kill`. It must exit on its own with the shell's status for the signal (128 + N), without a
//! panic and without spinning, and after `kill` leave the alternate screen it entered.

use std::process::Command;

/// Starts bch-tui as the session leader of a new pty (watching a port where no gateway listens,
/// so it redraws its reconnect countdown), answers its cursor position query as a terminal would,
/// waits until it drew its screen, then either closes the
/// pty (`hangup`: the kernel sends SIGHUP, as when a terminal window closes; `hangup-nohup`: the
/// same with SIGHUP ignored, as under `nohup`) or sends SIGTERM (`term`), and reports how the
/// process ended and the CPU time it used.
const DRIVER: &str = r#"
import fcntl, os, pty, select, signal, struct, sys, termios, time
exe, how = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    # An 80x24 terminal: a new pty has no size, and the console draws nothing at 0x0.
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    if how == "hangup-nohup":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.environ["TERM"] = "xterm-256color"
    os.execv(exe, [exe, "--url", "ws://127.0.0.1:9/ws"])
out = b""
deadline = time.time() + 30
while b"RECONNECTING" not in out:
    if time.time() > deadline:
        print("never drew its screen:", out[-200:])
        os.kill(pid, signal.SIGKILL)
        sys.exit(2)
    if select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            print("ended before drawing:", out[-300:])
            sys.exit(2)
        out += chunk
        # Answer the cursor position query, as a terminal does.
        if b"\x1b[6n" in chunk:
            os.write(fd, b"\x1b[1;1R")
if how.startswith("hangup"):
    os.close(fd)
else:
    os.kill(pid, signal.SIGTERM)
deadline = time.time() + 10
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    if not how.startswith("hangup") and select.select([fd], [], [], 0.05)[0]:
        try:
            out += os.read(fd, 65536)
        except OSError:
            pass
    else:
        time.sleep(0.05)
    if time.time() > deadline:
        os.kill(pid, signal.SIGKILL)
        print("still running 10 s after the signal")
        sys.exit(3)
if not how.startswith("hangup"):
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
killed = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
cpu = usage.ru_utime + usage.ru_stime
restored = b"\x1b[?1049l" in out
panicked = b"panicked" in out
print(f"code={code} killed_by={killed} cpu={cpu:.2f} restored={restored} panicked={panicked}")
"#;

/// Runs the driver for `how`; `None` (and a note) where there is no python3 to run it, which CI
/// does not accept.
fn drive(how: &str) -> Option<String> {
    let output = match Command::new("python3")
        .args(["-c", DRIVER, env!("CARGO_BIN_EXE_bch-tui"), how])
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "python3 is needed for the pty tests in CI: {e}"
            );
            eprintln!("skipped: no python3 to drive a pty ({e})");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "driver failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(stdout)
}

/// The CPU seconds in the driver's report.
fn cpu(report: &str) -> f64 {
    let field = report
        .split_whitespace()
        .find_map(|f| f.strip_prefix("cpu="))
        .unwrap_or_else(|| panic!("{report}"));
    field.parse().unwrap()
}

#[test]
fn a_terminal_that_hangs_up_ends_the_console_cleanly() {
    let Some(report) = drive("hangup") else {
        return;
    };
    assert!(
        report.contains("code=129 killed_by=None"),
        "exits on its own with 128 + SIGHUP: {report}"
    );
    assert!(cpu(&report) < 5.0, "no spinning: {report}");
}

/// Started with SIGHUP ignored, the console still takes the hangup as the end: before, it drew on
/// the dead terminal, failed, and panicked reporting that on the dead stderr (status 101).
#[test]
fn a_hangup_ends_the_console_even_under_nohup() {
    let Some(report) = drive("hangup-nohup") else {
        return;
    };
    assert!(report.contains("code=129 killed_by=None"), "{report}");
    assert!(cpu(&report) < 5.0, "no spinning: {report}");
}

#[test]
fn a_kill_ends_the_console_with_the_terminal_restored() {
    let Some(report) = drive("term") else {
        return;
    };
    assert!(
        report.contains("code=143 killed_by=None"),
        "exits on its own with 128 + SIGTERM: {report}"
    );
    assert!(
        report.contains("restored=True panicked=False"),
        "leaves the alternate screen: {report}"
    );
}
