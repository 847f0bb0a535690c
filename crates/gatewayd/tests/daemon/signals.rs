//! The daemon's flags over the file, SIGHUP reload (also right after start-up, and with demo
//! workers), SIGTERM shutdown (also after the log's reader went away), and a demo quiet enough
//! to keep its banner on screen.

use super::*;

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
        let mut daemon = Daemon::with_config(file.path());
        daemon.signal("HUP");
        daemon.wait_for_stderr("configuration reloaded");
        assert_eq!(daemon.get_json("/admin/policy")["min_load_gap"], 2);
        daemon.signal("TERM");
        assert!(daemon.wait().success());
    }
}

#[test]
fn demo_workers_survive_a_sighup_and_an_http_reload() {
    let (_file, mut daemon) = demo_daemon();
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
    // The pinned worker nobody serves: its failed first probe is a warning the demo must still show.
    let (_file, mut daemon) = demo_daemon();
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

#[test]
fn a_log_sink_that_goes_away_stops_no_request_and_no_shutdown() {
    // As with `gatewayd 2>&1 | tee log` after a Ctrl-C in the pipeline, or a log shipper that
    // restarts: the reading end of stderr closes while the gateway runs. No worker: each request
    // is a refusal that writes its access-log line.
    let file = TempFile::new(&daemon_config(2, 1.5, &[]));
    let mut daemon = Daemon::with_config(file.path());
    let request = |daemon: &Daemon| {
        let (status, body) = exchange(
            &daemon.data,
            "POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\nX-SMG-Routing-Key: k\r\n",
            "{}",
        );
        assert_eq!(
            status, 503,
            "a whole answer, not a reset connection: {body}"
        );
    };
    let reader = daemon.close_stderr();
    // Each request writes a line; the reader ends (and the pipe closes) at the first one.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reader.is_finished() {
        assert!(Instant::now() < deadline, "gatewayd wrote no line");
        request(&daemon);
    }
    reader.join().unwrap();
    // Every line from now on meets a broken pipe.
    for _ in 0..5 {
        request(&daemon);
    }
    daemon.signal("TERM");
    assert!(
        daemon.wait().success(),
        "SIGTERM still stops the gateway, which exits cleanly"
    );
}

/// `gatewayd --demo` with two simulated workers, on ports the system picks, and a file that pins
/// one worker nobody serves (`127.0.0.1:9`). The file lives as long as the returned `TempFile`.
fn demo_daemon() -> (TempFile, Daemon) {
    let file = TempFile::new(&daemon_config(2, 1.5, &["http://127.0.0.1:9"]));
    let mut command = gatewayd();
    command
        .args(["--demo", "--demo-workers", "2", "--config"])
        .arg(file.path())
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"]);
    (file, Daemon::spawn(command))
}
