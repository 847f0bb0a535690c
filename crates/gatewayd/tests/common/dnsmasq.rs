//! A real DNS server for discovery tests: `dnsmasq` on a free loopback port, serving a zone the
//! test writes, restartable with another zone and killable, as an operator's resolver would be.
//!
//! SRV records and their targets are `srv-host=` / `host-record=` lines of the configuration
//! (changed by a restart); A records are lines of an `addn-hosts` file (changed in place and
//! re-read on SIGHUP). Everything under `.test` is local: a name the zone does not have is
//! NXDOMAIN, not a query forwarded anywhere.
//!
//! Without dnsmasq (`apt-get install dnsmasq-base`) [`Dnsmasq::start`] answers `None` and the test
//! skips with a message, so a developer without it can still run `cargo test`; under CI
//! (`CI=true`) a missing dnsmasq fails the test instead, since `.ci/run` installs it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the server answers.
#[derive(Debug, Clone, Default)]
pub struct Zone {
    /// SRV records: (owner, target, port).
    pub srv: Vec<(String, String, u16)>,
    /// Address records of SRV targets: (name, address).
    pub hosts: Vec<(String, IpAddr)>,
    /// A/AAAA records served from the hosts file: (address, name).
    pub addresses: Vec<(IpAddr, String)>,
}

impl Zone {
    /// An SRV record `owner → target:port` and, when `address` is given, the target's address.
    pub fn srv(mut self, owner: &str, target: &str, port: u16, address: Option<IpAddr>) -> Zone {
        self.srv.push((owner.to_owned(), target.to_owned(), port));
        if let Some(address) = address
            && !self.hosts.iter().any(|(n, a)| n == target && *a == address)
        {
            self.hosts.push((target.to_owned(), address));
        }
        self
    }

    /// A zone of address records only: (address, name) lines of the hosts file.
    pub fn addresses(addresses: Vec<(IpAddr, String)>) -> Zone {
        Zone {
            addresses,
            ..Zone::default()
        }
    }
}

/// A running dnsmasq.
pub struct Dnsmasq {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    log: Option<mpsc::Receiver<String>>,
    /// While stopped by [`Dnsmasq::stop`], a TCP listener on the port: other tests start their own
    /// dnsmasq on free ports, and one that picked this port during the outage would answer this
    /// test's gateway and keep [`Dnsmasq::restart`] from binding. dnsmasq needs the TCP port too,
    /// so holding it turns such a pick into a retry on another port, while UDP queries are still
    /// refused at once, as a crashed resolver's are.
    held: Option<TcpListener>,
}

/// The dnsmasq binary, if installed (it lives in /usr/sbin, often not on a user's PATH).
fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join("dnsmasq"))
        .find(|candidate| candidate.is_file())
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl Dnsmasq {
    /// Starts dnsmasq serving `zone` on a free port of 127.0.0.1, or answers `None` (after saying
    /// why) when dnsmasq is not installed outside CI.
    pub fn start(zone: &Zone) -> Option<Dnsmasq> {
        if binary().is_none() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "dnsmasq is not installed, and CI needs it: .ci/run installs the Debian package dnsmasq-base"
            );
            eprintln!(
                "SKIPPED: dnsmasq is not installed (apt-get install dnsmasq-base); the discovery tests need a real DNS server"
            );
            return None;
        }
        let mut server = Dnsmasq {
            child: None,
            port: 0,
            dir: tempfile::tempdir().expect("temp dir"),
            log: None,
            held: None,
        };
        for _ in 0..20 {
            server.port = free_port();
            if server.launch(zone) {
                return Some(server);
            }
        }
        panic!("dnsmasq did not start on any of 20 free ports");
    }

    /// `127.0.0.1:PORT`, for `resolver =`.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Replaces the hosts file's address records and waits until dnsmasq re-read it (SIGHUP).
    pub fn set_addresses(&mut self, addresses: &[(IpAddr, String)]) {
        while self.log.as_ref().expect("running").try_recv().is_ok() {}
        write_hosts(&self.hosts_file(), addresses);
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        self.wait_for_log(&format!(" - {} names", addresses.len()));
    }

    /// Stops dnsmasq (SIGKILL): queries go unanswered, as with a crashed resolver. The port stays
    /// reserved for [`Dnsmasq::restart`].
    pub fn kill(&mut self) {
        self.end_process();
        if self.held.is_none() {
            self.held = TcpListener::bind(self.address()).ok();
        }
    }

    /// Starts dnsmasq again on the same port with `zone`.
    pub fn restart(&mut self, zone: &Zone) {
        self.end_process();
        self.held = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.launch(zone) {
            assert!(
                Instant::now() < deadline,
                "dnsmasq did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn end_process(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn hosts_file(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    /// Writes the configuration and starts dnsmasq; `false` when it could not bind its port.
    fn launch(&mut self, zone: &Zone) -> bool {
        write_hosts(&self.hosts_file(), &zone.addresses);
        let conf = self.dir.path().join("dnsmasq.conf");
        std::fs::write(&conf, config(self.port, &self.hosts_file(), zone)).expect("config written");
        let mut child = Command::new(binary().expect("checked"))
            .arg("-k")
            .arg(format!("--conf-file={}", conf.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("dnsmasq runs");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.child = Some(child);
        self.log = Some(rx);
        // "started" comes once the sockets are bound; a busy port ends the process instead.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.as_ref().expect("set").recv_timeout(left) {
                Ok(line) if line.contains("started, version") => {
                    // The hosts file is read right after; its line must not be mistaken for a
                    // later re-read's.
                    let hosts = format!("read {}", self.hosts_file().display());
                    self.wait_for_log(&hosts);
                    return true;
                }
                Ok(line) if line.contains("failed to create listening socket") => {
                    self.end_process();
                    return false;
                }
                Ok(_) => {}
                Err(_) => {
                    self.end_process();
                    return false;
                }
            }
        }
    }

    fn wait_for_log(&mut self, needle: &str) {
        let log = self.log.as_ref().expect("running");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match log.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(e) => panic!("dnsmasq never logged {needle:?}: {e}"),
            }
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.end_process();
    }
}

fn config(port: u16, hosts: &Path, zone: &Zone) -> String {
    let mut lines = vec![
        format!("port={port}"),
        "listen-address=127.0.0.1".into(),
        "bind-interfaces".into(),
        "no-resolv".into(),
        "no-hosts".into(),
        format!("addn-hosts={}", hosts.display()),
        // A TTL of one second: answers expire quickly, as the tests change them.
        "local-ttl=1".into(),
        "local=/test/".into(),
        "log-facility=-".into(),
        "pid-file=".into(),
    ];
    if running_as_root() {
        // Otherwise dnsmasq drops to "nobody", who may not read the test's temp dir.
        lines.push("user=root".into());
    }
    for (owner, target, port) in &zone.srv {
        lines.push(format!("srv-host={owner},{target},{port},0,10"));
    }
    for (name, address) in &zone.hosts {
        lines.push(format!("host-record={name},{address}"));
    }
    lines.join("\n") + "\n"
}

fn write_hosts(path: &Path, addresses: &[(IpAddr, String)]) {
    let text: String = addresses
        .iter()
        .map(|(address, name)| format!("{address} {name}\n"))
        .collect();
    std::fs::write(path, text).expect("hosts file written");
}

/// A port free for UDP on 127.0.0.1 right now (dnsmasq takes TCP on it too; a clash is retried).
fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free UDP port")
        .port()
}
