//! A DNS answer reduced to what discovery uses, and the rules that turn it into workers. Pure: the
//! resolver fills an [`Answer`], [`parse`] decides which records are workers and which are bad.
//!
//! Bad records are skipped, each with a reason naming it, and the rest applied: an SRV record with
//! port 0, a target `.` ("no service", RFC 2782), a target without an address, an address that is
//! not a unicast address, and a second record for an address (and port) already found. Records
//! are sorted before they are read, so the workers and the warnings do not depend on the order a
//! server happened to answer in (dnsmasq, for one, rotates it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::admin::DiscoveredWorker;
use crate::config::{DiscoveryConfig, DnsKind};

/// One record of the answer to the source's own name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Record {
    /// An SRV record. Priority and weight are kept only to name the record in warnings: every
    /// target is a worker, and the ring gives each the same share.
    Srv {
        /// Priority, as published.
        priority: u16,
        /// Weight, as published.
        weight: u16,
        /// The worker's port.
        port: u16,
        /// The target host name, as published (usually with a trailing dot).
        target: String,
    },
    /// An A or AAAA record.
    Address(IpAddr),
}

/// An answer: the records for the name, the addresses known for SRV targets (from the answer's
/// additional section or follow-up lookups), and how long the answer is valid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// The SRV or A/AAAA records answering the source's name.
    pub records: Vec<Record>,
    /// Addresses of SRV targets, by [`target_key`].
    pub addresses: HashMap<String, Vec<IpAddr>>,
    /// Time until the shortest TTL of the answer runs out; `None` when unknown.
    pub ttl: Option<Duration>,
    /// A or AAAA lookups that failed while the other family of the same name answered: the
    /// answer stands on that family; each is logged and counted, not fatal.
    pub failed_lookups: Vec<FailedLookup>,
}

/// An address family, as the record type that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressFamily {
    /// IPv4, A records.
    A,
    /// IPv6, AAAA records.
    Aaaa,
}

impl AddressFamily {
    /// The record type's name: `A` or `AAAA` (also the metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            AddressFamily::A => "A",
            AddressFamily::Aaaa => "AAAA",
        }
    }
}

/// One family's lookup of a name that failed (an error code such as REFUSED, a timeout).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FailedLookup {
    /// The name looked up: the source's own, or an SRV target.
    pub name: String,
    /// The record type asked for.
    pub family: AddressFamily,
    /// What kind of failure, for the failure counter should it fail the resolution.
    pub kind: FailureKind,
    /// Why it failed, as the resolver said.
    pub reason: String,
}

/// What kind of failure a failed resolution was: the `reason` label of
/// `bch_discovery_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureKind {
    /// No answer within `timeout_ms` (a resolver that is down, slow or unreachable).
    Timeout,
    /// The answer is too large for one DNS message: truncated over UDP, and not whole over TCP
    /// either (a message holds at most 65,535 bytes).
    Truncated,
    /// Anything else: an error code (SERVFAIL, REFUSED, …), a refused or broken connection, an
    /// answer that does not decode, no resolver configuration.
    Error,
}

impl FailureKind {
    /// Every kind, in label order.
    pub const ALL: [FailureKind; 3] = [
        FailureKind::Timeout,
        FailureKind::Truncated,
        FailureKind::Error,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Truncated => "truncated",
            FailureKind::Error => "error",
        }
    }

    /// Position in [`FailureKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for FailedLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.name, self.family.as_str(), self.reason)
    }
}

/// The workers an answer gives, and the records it skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// Workers, sorted by address.
    pub workers: Vec<DiscoveredWorker>,
    /// One sentence per skipped record, naming it and why.
    pub skipped: Vec<String>,
}

/// How SRV targets are compared: lower case, without the trailing dot.
pub fn target_key(target: &str) -> String {
    target.trim_end_matches('.').to_ascii_lowercase()
}

/// The workers `answer` gives for `source`; see the module documentation for what is skipped.
pub fn parse(source: &DiscoveryConfig, answer: &Answer) -> Parsed {
    let mut records = answer.records.clone();
    records.sort();
    records.dedup();
    let mut parsed = Parsed::default();
    let mut seen = HashSet::new();
    match (source.kind(), source.port) {
        (DnsKind::Address, Some(port)) => {
            for record in &records {
                if let Record::Address(ip) = record {
                    let shown = format!("{} A/AAAA {ip}", source.dns);
                    add(
                        &mut parsed,
                        &mut seen,
                        &shown,
                        SocketAddr::new(*ip, port),
                        None,
                    );
                }
            }
        }
        _ => parse_srv(source, answer, &records, &mut parsed, &mut seen),
    }
    parsed.workers.sort();
    parsed
}

fn parse_srv(
    source: &DiscoveryConfig,
    answer: &Answer,
    records: &[Record],
    parsed: &mut Parsed,
    seen: &mut HashSet<SocketAddr>,
) {
    // A target is a readable name only when it stands for one worker.
    let mut per_target: BTreeMap<String, HashSet<SocketAddr>> = BTreeMap::new();
    let mut usable = Vec::new();
    for record in records {
        let Record::Srv {
            priority,
            weight,
            port,
            target,
        } = record
        else {
            continue;
        };
        let shown = format!("{} SRV {priority} {weight} {port} {target}", source.dns);
        let key = target_key(target);
        if *port == 0 {
            parsed.skipped.push(format!("{shown}: port 0"));
        } else if key.is_empty() {
            parsed
                .skipped
                .push(format!("{shown}: target \".\" means no service"));
        } else {
            match answer.addresses.get(&key).filter(|a| !a.is_empty()) {
                None => parsed
                    .skipped
                    .push(format!("{shown}: target {key} has no A/AAAA address")),
                Some(ips) => {
                    let mut ips = ips.clone();
                    ips.sort();
                    ips.dedup();
                    for ip in ips {
                        let addr = SocketAddr::new(ip, *port);
                        per_target.entry(key.clone()).or_default().insert(addr);
                        usable.push((shown.clone(), key.clone(), addr));
                    }
                }
            }
        }
    }
    for (shown, key, addr) in usable {
        let name = (per_target[&key].len() == 1).then(|| key.clone());
        add(parsed, seen, &format!("{shown} ({addr})"), addr, name);
    }
}

/// Adds one worker unless its address is no unicast address or was found already.
fn add(
    parsed: &mut Parsed,
    seen: &mut HashSet<SocketAddr>,
    shown: &str,
    addr: SocketAddr,
    name: Option<String>,
) {
    let ip = addr.ip();
    if ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]) {
        parsed
            .skipped
            .push(format!("{shown}: {ip} is not a unicast address"));
    } else if !seen.insert(addr) {
        parsed
            .skipped
            .push(format!("{shown}: duplicate address {addr}"));
    } else {
        parsed.workers.push(DiscoveredWorker { addr, name });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn srv(port: u16, target: &str) -> Record {
        Record::Srv {
            priority: 0,
            weight: 10,
            port,
            target: target.to_owned(),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn srv_records_become_named_workers_and_bad_ones_are_skipped_by_name() {
        let source = DiscoveryConfig::new("_http._tcp.llm.test");
        let answer = Answer {
            records: vec![
                srv(8001, "w1.llm.test."),
                srv(8000, "w0.llm.test."),
                srv(0, "w2.llm.test."),
                srv(8002, "nohost.llm.test."),
                srv(8003, "."),
                srv(8000, "alias.llm.test."),
                srv(8004, "two.llm.test."),
            ],
            addresses: HashMap::from([
                ("w0.llm.test".to_owned(), vec![ip("127.0.0.2")]),
                ("w1.llm.test".to_owned(), vec![ip("127.0.0.3")]),
                ("w2.llm.test".to_owned(), vec![ip("127.0.0.4")]),
                ("alias.llm.test".to_owned(), vec![ip("127.0.0.2")]),
                ("two.llm.test".to_owned(), vec![ip("::1"), ip("127.0.0.5")]),
            ]),
            ttl: None,
            failed_lookups: Vec::new(),
        };
        let parsed = parse(&source, &answer);
        let workers: Vec<(String, Option<&str>)> = parsed
            .workers
            .iter()
            .map(|w| (w.addr.to_string(), w.name.as_deref()))
            .collect();
        assert_eq!(
            workers,
            [
                ("127.0.0.2:8000".to_owned(), Some("alias.llm.test")),
                ("127.0.0.3:8001".to_owned(), Some("w1.llm.test")),
                ("127.0.0.5:8004".to_owned(), None),
                ("[::1]:8004".to_owned(), None),
            ],
            "the first record for 127.0.0.2:8000 in sorted order wins; a two-address target is IP:PORT"
        );
        let skipped = parsed.skipped.join("\n");
        for needle in [
            "SRV 0 10 0 w2.llm.test.: port 0",
            "SRV 0 10 8002 nohost.llm.test.: target nohost.llm.test has no A/AAAA address",
            "SRV 0 10 8003 .: target \".\" means no service",
            "SRV 0 10 8000 w0.llm.test. (127.0.0.2:8000): duplicate address 127.0.0.2:8000",
        ] {
            assert!(skipped.contains(needle), "{needle:?} not in\n{skipped}");
        }
        assert_eq!(parsed.skipped.len(), 4);
        let mut reversed = answer.clone();
        reversed.records.reverse();
        assert_eq!(
            parse(&source, &reversed),
            parsed,
            "answer order does not matter"
        );
    }

    #[test]
    fn address_records_take_the_sources_port_and_skip_non_unicast_addresses() {
        let source = DiscoveryConfig {
            port: Some(8000),
            ..DiscoveryConfig::new("llm.test")
        };
        let answer = Answer {
            records: vec![
                Record::Address(ip("10.0.0.2")),
                Record::Address(ip("0.0.0.0")),
                Record::Address(ip("fd00::7")),
                Record::Address(ip("224.0.0.1")),
            ],
            ..Answer::default()
        };
        let parsed = parse(&source, &answer);
        let addrs: Vec<String> = parsed.workers.iter().map(|w| w.addr.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.2:8000", "[fd00::7]:8000"]);
        assert!(parsed.workers.iter().all(|w| w.name.is_none()));
        assert_eq!(parsed.skipped.len(), 2, "{:?}", parsed.skipped);
        assert!(parsed.skipped[0].starts_with("llm.test A/AAAA 0.0.0.0"));
    }
}
