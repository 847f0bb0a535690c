//! The real `gatewayd` binary discovering workers from the command line (`--discover-dns`,
//! `--dns-resolver`, `--discovery-interval-ms`, `--discover-port`) at a real dnsmasq, for what an
//! operator reads in its log: a dead resolver keeps the fleet and is reported once per outage; a
//! restarted resolver's changed set is applied; bad records are skipped with a warning naming each,
//! once; an empty source's state is logged once, not a change per refresh. And `check-config`
//! refusing bad `[[discovery]]` entries.

use crate::common;
use crate::dnsmasq;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_worker};
use dnsmasq::{Dnsmasq, Zone};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const SRV: &str = "_http._tcp.llm.test";
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A `gatewayd` process on free ports, its log collected line by line.
struct Daemon {
    _child: tokio::process::Child,
    data: String,
    control: String,
    log: Arc<Mutex<Vec<String>>>,
    /// The number of lines in `log`, announced after each line: the daemon logs a change after it
    /// applied it, and the line crosses a pipe, so a test that saw the change through the API
    /// waits on this for the line instead of counting at once.
    lines: tokio::sync::watch::Receiver<usize>,
}

impl Daemon {
    async fn start(args: &[&str]) -> Daemon {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gatewayd"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
            .env_remove("GATEWAYD_CONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("gatewayd runs");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut banner) = tokio::sync::mpsc::unbounded_channel();
        let lines = Arc::clone(&log);
        let (count_tx, count) = tokio::sync::watch::channel(0);
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let total = {
                    let mut lines = lines.lock().unwrap();
                    lines.push(line.clone());
                    lines.len()
                };
                let _ = count_tx.send(total);
                let _ = tx.send(line);
            }
        });
        let after = |line: &str, label: &str| {
            let rest = line.split(label).nth(1)?.split("http://").nth(1)?;
            Some(rest.split_whitespace().next()?.to_owned())
        };
        loop {
            let line = tokio::time::timeout(Duration::from_secs(20), banner.recv())
                .await
                .expect("gatewayd's banner")
                .expect("gatewayd still running");
            if let (Some(data), Some(control)) =
                (after(&line, "data plane"), after(&line, "control plane"))
            {
                return Daemon {
                    _child: child,
                    data,
                    control,
                    log,
                    lines: count,
                };
            }
        }
    }

    /// Log lines containing `needle`, once at least `at_least` of them arrived (or 20 s passed).
    async fn logged_at_least(&self, needle: &str, at_least: usize) -> usize {
        let mut lines = self.lines.clone();
        let _ = tokio::time::timeout(
            Duration::from_secs(20),
            lines.wait_for(|_| self.logged(needle) >= at_least),
        )
        .await;
        self.logged(needle)
    }

    /// Log lines containing `needle`.
    fn logged(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    async fn workers(&self) -> Vec<Value> {
        let body: Value = bch_drill::tls::get(format!("http://{}/admin/workers", self.control))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["workers"].as_array().unwrap().clone()
    }

    async fn names(&self) -> BTreeSet<String> {
        let workers = self.workers().await;
        workers
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Polls (bounded) until the worker names are `expected`.
    async fn wait_names(&self, expected: &[&str]) {
        let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.names().await != expected {
            assert!(
                Instant::now() < deadline,
                "never saw {expected:?}: {:?}",
                self.names().await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn metric(&self, prefix: &str) -> f64 {
        let text = bch_drill::tls::get(format!("http://{}/metrics", self.control))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Polls (bounded) until the metric line `prefix` reaches `value`.
    async fn wait_metric(&self, prefix: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.metric(prefix).await < value {
            assert!(Instant::now() < deadline, "{prefix} never reached {value}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A keyed chat completion through the data plane; answers who served it.
    async fn chat(&self, key: &str) -> String {
        let response = common::client()
            .post(format!("http://{}/v1/chat/completions", self.data))
            .header("x-smg-routing-key", key)
            .json(&json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":2}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{key}");
        response.headers()["x-bch-worker"]
            .to_str()
            .unwrap()
            .to_owned()
    }
}

async fn sims(n: usize) -> Vec<WorkerHandle> {
    let mut workers = Vec::new();
    for i in 0..n {
        let addr = SocketAddr::new(LOOPBACK, 0);
        let config = SimConfig::default().with_time_scale(0.0);
        workers.push(
            spawn_worker(addr, format!("sim-{i}"), config)
                .await
                .unwrap(),
        );
    }
    workers
}

/// SRV records for the `sims` at `indices`, targets `w{i}.llm.test`.
fn zone_of(sims: &[WorkerHandle], indices: &[usize]) -> Zone {
    indices.iter().fold(Zone::default(), |zone, &i| {
        let port = sims[i].local_addr().port();
        zone.srv(SRV, &format!("w{i}.llm.test"), port, Some(LOOPBACK))
    })
}

fn flags(dns: &Dnsmasq) -> Vec<String> {
    [
        "--discover-dns",
        SRV,
        "--dns-resolver",
        &dns.address().to_string(),
        "--discovery-interval-ms",
        "200",
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test]
async fn a_dead_resolver_keeps_the_fleet_reports_once_and_its_changed_set_applies_when_back() {
    let sims = sims(4).await;
    let Some(mut dns) = Dnsmasq::start(&zone_of(&sims, &[0, 1, 2])) else {
        return;
    };
    let args = flags(&dns);
    let daemon = Daemon::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    daemon
        .wait_names(&["w0.llm.test", "w1.llm.test", "w2.llm.test"])
        .await;
    dns.kill();
    // A killed resolver does not answer: every resolution times out.
    let errors = format!("bch_discovery_errors_total{{source=\"dns:{SRV}\",reason=\"timeout\"}}");
    daemon.wait_metric(&errors, 3.0).await;
    assert_eq!(daemon.workers().await.len(), 3, "the last good set stays");
    for i in 0..10 {
        daemon.chat(&format!("session-{i}")).await;
    }
    assert_eq!(
        daemon.logged_at_least("DNS resolution failed", 1).await,
        1,
        "one warning per outage"
    );
    dns.restart(&zone_of(&sims, &[0, 2, 3]));
    daemon
        .wait_names(&["w0.llm.test", "w2.llm.test", "w3.llm.test"])
        .await;
    assert_eq!(
        daemon.logged_at_least("DNS answers again after", 1).await,
        1
    );
    assert_eq!(daemon.logged("DNS resolution failed"), 1);
    assert_eq!(
        daemon
            .logged_at_least("discovered workers changed", 2)
            .await,
        2,
        "the first set, then the change"
    );
    assert!(
        daemon.metric(&errors).await >= 3.0,
        "errors are counted, not just logged"
    );
}

/// A source that has never had records says so once, and then nothing: no membership change is
/// logged (nor made) for an empty answer that follows an empty answer.
#[tokio::test]
async fn an_empty_source_logs_its_state_once_not_a_change_per_refresh() {
    let Some(dns) = Dnsmasq::start(&Zone::default()) else {
        return;
    };
    let args = flags(&dns);
    let daemon = Daemon::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let refreshes = format!("bch_discovery_refreshes_total{{source=\"dns:{SRV}\"}}");
    daemon.wait_metric(&refreshes, 6.0).await;
    assert_eq!(
        daemon.logged("discovered workers changed"),
        0,
        "an empty answer after an empty answer changes nothing"
    );
    assert_eq!(
        daemon
            .logged_at_least("discovery source is empty (was pending): NXDOMAIN", 1)
            .await,
        1,
        "the state change, once"
    );
    let health: Value = bch_drill::tls::get(format!("http://{}/admin/discovery", daemon.control))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["sources"][0]["state"], "empty");
}

#[tokio::test]
async fn bad_records_are_skipped_with_one_warning_naming_each_and_the_rest_applied() {
    let sims = sims(2).await;
    let port0 = sims[0].local_addr().port();
    let zone = zone_of(&sims, &[0, 1])
        .srv(SRV, "w2.llm.test", 0, Some(LOOPBACK))
        .srv(SRV, "nohost.llm.test", 9, None)
        .srv(SRV, "zdup.llm.test", port0, Some(LOOPBACK));
    let Some(_dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let args = flags(&_dns);
    let daemon = Daemon::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    daemon.wait_names(&["w0.llm.test", "w1.llm.test"]).await;
    let skipped = format!("bch_discovery_skipped_records{{source=\"dns:{SRV}\"}}");
    assert_eq!(daemon.metric(&skipped).await, 3.0);
    let refreshes = format!("bch_discovery_refreshes_total{{source=\"dns:{SRV}\"}}");
    let seen = daemon.metric(&refreshes).await;
    daemon.wait_metric(&refreshes, seen + 3.0).await;
    for needle in [
        &format!("{SRV} SRV 0 10 0 w2.llm.test.: port 0"),
        &format!("{SRV} SRV 0 10 9 nohost.llm.test.: target nohost.llm.test has no A/AAAA address"),
        &format!(
            "{SRV} SRV 0 10 {port0} zdup.llm.test. (127.0.0.1:{port0}): duplicate address 127.0.0.1:{port0}"
        ),
    ] {
        assert_eq!(
            daemon.logged_at_least(needle, 1).await,
            1,
            "{needle:?} once, not per refresh"
        );
    }
    let served: BTreeSet<String> = {
        let mut served = BTreeSet::new();
        for i in 0..20 {
            served.insert(daemon.chat(&format!("k{i}")).await);
        }
        served
    };
    assert_eq!(served.len(), 2, "both good records serve");
}

#[tokio::test]
async fn an_a_record_name_from_the_command_line_takes_the_discover_port() {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _worker = common::fake_worker_on(listener, "fake").await;
    let zone = Zone::addresses(vec![("127.0.0.2".parse().unwrap(), "one.llm.test".into())]);
    let Some(dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let resolver = dns.address().to_string();
    let port_text = port.to_string();
    let daemon = Daemon::start(&[
        "--discover-dns",
        "one.llm.test",
        "--discover-port",
        &port_text,
        "--dns-resolver",
        &resolver,
    ])
    .await;
    let name = format!("127.0.0.2:{port}");
    daemon.wait_names(&[&name]).await;
    let workers = daemon.workers().await;
    assert_eq!(workers[0]["url"], format!("http://127.0.0.2:{port}"));
    assert_eq!(workers[0]["source"], "dns:one.llm.test");
}

/// A name whose address flips at every refresh changes the membership every time, but the source
/// logs at most `[log] state_change_lines` lines per `state_change_period_ms`, over several
/// periods; `bch_log_lines_suppressed_total{component="discovery"}` and the summary lines account
/// for the rest.
#[tokio::test]
async fn a_flapping_name_logs_a_bounded_number_of_lines_and_counts_the_rest() {
    const NAME: &str = "flap.llm.test";
    const FLIPS: usize = 30;
    const LINES: usize = 3;
    const PERIOD: Duration = Duration::from_millis(500);
    let addresses =
        ["127.0.0.2", "127.0.0.3"].map(|a| (a.parse::<IpAddr>().unwrap(), NAME.to_owned()));
    let Some(mut dns) = Dnsmasq::start(&Zone::addresses(vec![addresses[0].clone()])) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gatewayd.toml");
    std::fs::write(
        &file,
        format!(
            "[log]\nstate_change_lines = {LINES}\nstate_change_period_ms = {}\n[health]\ninterval_ms = 60000\n",
            PERIOD.as_millis()
        ),
    )
    .unwrap();
    let resolver = dns.address().to_string();
    let daemon = Daemon::start(&[
        "--config",
        file.to_str().unwrap(),
        "--discover-dns",
        NAME,
        "--discover-port",
        "8000",
        "--dns-resolver",
        &resolver,
        "--discovery-interval-ms",
        "100",
    ])
    .await;
    daemon.wait_names(&["127.0.0.2:8000"]).await;
    let began = Instant::now();
    for flip in 1..=FLIPS {
        let address = &addresses[flip % 2];
        dns.set_addresses(std::slice::from_ref(address));
        // The membership follows every flip: only the lines are limited.
        daemon.wait_names(&[&format!("{}:8000", address.0)]).await;
    }
    let lasted = began.elapsed();
    assert!(
        lasted > 2 * PERIOD,
        "the flapping outlasts several periods: {lasted:?}"
    );
    let suppressed_metric = "bch_log_lines_suppressed_total{component=\"discovery\"}";
    let summarised = |daemon: &Daemon| -> f64 {
        common::suppressed_in_summaries(daemon.log.lock().unwrap().iter(), &format!("dns:{NAME}"))
            as f64
    };
    // The last period's suppressed lines are summed up when it ends (the refreshes go on).
    let deadline = Instant::now() + Duration::from_secs(20);
    let suppressed = loop {
        let suppressed = daemon.metric(suppressed_metric).await;
        if suppressed > 0.0 && summarised(&daemon) == suppressed {
            break suppressed;
        }
        assert!(
            Instant::now() < deadline,
            "suppressed {suppressed}, summarised {}",
            summarised(&daemon)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let changed = daemon.logged("discovered workers changed");
    let periods = (lasted.as_millis() / PERIOD.as_millis()) as usize + 2;
    assert!(
        changed <= LINES * periods,
        "{changed} membership lines in {lasted:?}: {:#?}",
        daemon.log.lock().unwrap()
    );
    // Every flip was a change to log: each was logged or counted.
    assert!(
        changed as f64 + suppressed >= FLIPS as f64,
        "{changed} logged + {suppressed} suppressed of {FLIPS} flips"
    );
    assert_eq!(daemon.logged("panicked"), 0);
}

/// dnsmasq without upstream servers refuses AAAA for a name of its hosts file outside its local
/// domains: the refusal is warned about once. An outage of the whole resolver in between is an
/// outage, not "both families answer again", and the refusal after it is no news.
#[tokio::test]
async fn a_refused_family_is_reported_once_across_a_resolver_outage() {
    const NAME: &str = "llm.example";
    let zone = Zone::addresses(vec![("127.0.0.2".parse().unwrap(), NAME.into())]);
    let Some(mut dns) = Dnsmasq::start(&zone) else {
        return;
    };
    let resolver = dns.address().to_string();
    let daemon = Daemon::start(&[
        "--discover-dns",
        NAME,
        "--discover-port",
        "8000",
        "--dns-resolver",
        &resolver,
        "--discovery-interval-ms",
        "200",
    ])
    .await;
    daemon.wait_names(&["127.0.0.2:8000"]).await;
    const REFUSED: &str = "address lookup failed, the other family answered";
    assert_eq!(daemon.logged_at_least(REFUSED, 1).await, 1);
    dns.kill();
    let errors = format!("bch_discovery_errors_total{{source=\"dns:{NAME}\",reason=\"timeout\"}}");
    daemon.wait_metric(&errors, 2.0).await;
    dns.restart(&zone);
    assert_eq!(
        daemon.logged_at_least("DNS answers again after", 1).await,
        1
    );
    let refreshes = format!("bch_discovery_refreshes_total{{source=\"dns:{NAME}\"}}");
    let seen = daemon.metric(&refreshes).await;
    daemon.wait_metric(&refreshes, seen + 3.0).await;
    assert_eq!(
        daemon.logged("address lookups of both families answer again"),
        0,
        "a failed resolution says nothing about either family"
    );
    assert_eq!(daemon.logged(REFUSED), 1, "the same refusal, once");
}

fn gatewayd(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gatewayd"))
        .args(args)
        .env_remove("GATEWAYD_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn check_config_validates_discovery_entries_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let file = dir.path().join("gatewayd.toml");
        std::fs::write(&file, text).unwrap();
        gatewayd(&["check-config", file.to_str().unwrap()])
    };
    for (text, field) in [
        ("[[discovery]]\ndns = \"llm.test\"\n", "discovery[0].port"),
        (
            "[[discovery]]\ndns = \"_h._tcp.llm.test\"\nport = 80\n",
            "discovery[0].port",
        ),
        (
            "[[discovery]]\ndns = \"_h._tcp.llm.test\"\nscheme = \"ftp\"\n",
            "discovery[0].scheme",
        ),
        (
            "[[discovery]]\ndns = \"_h._tcp.llm.test\"\nserver_name = \"llm.test\"\n",
            "discovery[0].server_name",
        ),
        (
            "[[discovery]]\ndns = \"_h._tcp.llm.test\"\ninterval_ms = 5\n",
            "discovery[0].interval_ms",
        ),
        (
            "[[discovery]]\ndns = \"bad name\"\nport = 80\n",
            "discovery[0].dns",
        ),
        (
            "[[discovery]]\ndns = \"_h._tcp.llm.test\"\nresolver = \"dns.local\"\n",
            "resolver",
        ),
        (
            "[[discovery]]\ndns = \"_h._tcp.a\"\n[[discovery]]\ndns = \"_H._tcp.A.\"\n",
            "discovery[1].dns",
        ),
    ] {
        let output = check(text);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{text:?} passed");
        assert!(stderr.contains(field), "{text:?}: {stderr}");
    }
    let output = check(
        "[[discovery]]\ndns = \"_http._tcp.llm.default.svc.cluster.local\"\n\
         [[discovery]]\ndns = \"llm.service.consul\"\nport = 8000\nresolver = \"127.0.0.1:8600\"\n",
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("2 discovery sources"));
}

#[test]
fn an_a_record_name_without_a_port_is_refused_at_start_naming_the_flag() {
    let output = gatewayd(&["--discover-dns", "llm.test", "--listen", "127.0.0.1:0"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--discover-port"), "{stderr}");
}
