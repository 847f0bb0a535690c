//! Asking DNS: one hickory resolver per source, pointed at the source's `resolver` (any address
//! and port, UDP with TCP for truncated answers) or at the system's configuration, and the answer
//! reduced to an [`Answer`].
//!
//! hickory's own cache is off: every refresh asks the server, and the answer's TTL paces the
//! refreshes instead (see `safety::next_refresh`). SRV targets whose addresses the answer's
//! additional section did not carry are looked up, a few at a time. A resolution is bounded by
//! the source's `timeout_ms` as a whole.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::{Resolver, TokioResolver};

use super::records::{AddressFamily, Answer, FailedLookup, FailureKind, Record, target_key};
use crate::config::{DiscoveryConfig, DnsKind};

/// SRV targets looked up at once when the answer carried no addresses for them.
const TARGET_LOOKUPS: usize = 16;

/// One resolution's result.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The server answered with records.
    Answer(Answer),
    /// The server answered that there are none: `NXDOMAIN` or `no records`.
    Empty(String),
    /// No usable answer: the resolver's error, a timeout, a truncated answer, SERVFAIL or another
    /// error code; what kind, and why.
    Failed(FailureKind, String),
}

/// A lookup that did not give records: empty, or failed.
enum Missing {
    Empty(String),
    Failed(FailureKind, String),
}

/// The addresses of one name: what the families that answered gave, and the lookups that failed.
#[derive(Default)]
struct Addresses {
    ips: Vec<IpAddr>,
    ttl: Duration,
    failed: Vec<FailedLookup>,
}

/// The resolver of one source.
pub struct SourceResolver {
    resolver: TokioResolver,
    source: DiscoveryConfig,
}

impl SourceResolver {
    /// A resolver for `source`. Fails only when the system's resolver configuration cannot be read
    /// (no `/etc/resolv.conf`) and the source names no `resolver`.
    pub fn new(source: &DiscoveryConfig) -> Result<Self, String> {
        let mut builder = match source.resolver {
            Some(server) => {
                let mut config = NameServerConfig::udp_and_tcp(server.ip());
                for connection in &mut config.connections {
                    connection.port = server.port();
                }
                let mut builder = Resolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![config]),
                    TokioRuntimeProvider::default(),
                );
                // The server named is the authority asked for; /etc/hosts is not.
                builder.options_mut().use_hosts_file = ResolveHosts::Never;
                builder
            }
            None => TokioResolver::builder_tokio()
                .map_err(|e| format!("cannot read the system resolver configuration: {e}"))?,
        };
        let options = builder.options_mut();
        options.cache_size = 0;
        // Two tries per query fit in the source's timeout; the whole resolution is bounded too.
        options.attempts = 1;
        options.timeout = (source.timeout / 2).max(Duration::from_millis(1));
        let resolver = builder
            .build()
            .map_err(|e| format!("cannot build a resolver: {e}"))?;
        Ok(Self {
            resolver,
            source: source.clone(),
        })
    }

    /// Resolves the source's name once, within its `timeout_ms`.
    pub async fn resolve(&self) -> Resolution {
        let timeout = self.source.timeout;
        let resolution = async {
            match self.source.kind() {
                DnsKind::Srv => self.resolve_srv().await,
                DnsKind::Address => self.resolve_addresses().await,
            }
        };
        match tokio::time::timeout(timeout, resolution).await {
            Ok(Ok(answer)) => Resolution::Answer(answer),
            Ok(Err(Missing::Empty(why))) => Resolution::Empty(why),
            Ok(Err(Missing::Failed(kind, why))) => Resolution::Failed(kind, why),
            Err(_) => Resolution::Failed(
                FailureKind::Timeout,
                format!(
                    "no answer within timeout_ms {}",
                    crate::config::millis::as_millis(timeout)
                ),
            ),
        }
    }

    async fn resolve_srv(&self) -> Result<Answer, Missing> {
        let lookup = self.lookup(&self.source.dns, RecordType::SRV).await?;
        let mut answer = Answer {
            ttl: Some(ttl_of(&lookup)),
            ..Answer::default()
        };
        for record in lookup.answers() {
            if let RData::SRV(srv) = &record.data {
                answer.records.push(Record::Srv {
                    priority: srv.priority,
                    weight: srv.weight,
                    port: srv.port,
                    target: srv.target.to_string(),
                });
            }
        }
        add_addresses(&mut answer, &lookup);
        let missing: HashSet<String> = answer
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Srv { port, target, .. } if *port != 0 => Some(target_key(target)),
                _ => None,
            })
            .filter(|key| !key.is_empty() && !answer.addresses.contains_key(key))
            .collect();
        let mut lookups = futures_util::stream::iter(missing)
            .map(|target| async move { (self.addresses_of(&target).await, target) })
            .buffer_unordered(TARGET_LOOKUPS);
        while let Some((found, target)) = lookups.next().await {
            match found {
                Ok(found) => {
                    answer.addresses.insert(target, found.ips);
                    let ttl = found.ttl;
                    answer.ttl = Some(answer.ttl.map_or(ttl, |earlier| earlier.min(ttl)));
                    answer.failed_lookups.extend(found.failed);
                }
                // A target without an address is a bad record, skipped when parsed.
                Err(Missing::Empty(_)) => {}
                // A resolver that fails on a target could fail on any: keep the last good set.
                Err(Missing::Failed(kind, why)) => {
                    return Err(Missing::Failed(kind, format!("looking up {target}: {why}")));
                }
            }
        }
        Ok(answer)
    }

    async fn resolve_addresses(&self) -> Result<Answer, Missing> {
        let found = self.addresses_of(&self.source.dns).await?;
        Ok(Answer {
            records: found.ips.into_iter().map(Record::Address).collect(),
            ttl: Some(found.ttl),
            failed_lookups: found.failed,
            ..Answer::default()
        })
    }

    /// A and AAAA addresses of `name`, the shorter TTL of the families that answered, and the
    /// lookups that failed. Each family stands alone: a refused or failed AAAA lookup (dnsmasq
    /// without upstream servers refuses AAAA for a name it has only an A record for) does not
    /// discard the A answer, and the other way round. Without an address from either family the
    /// result is a failure when a lookup failed (a failure says nothing about the fleet, so the last
    /// good set stays), else empty.
    async fn addresses_of(&self, name: &str) -> Result<Addresses, Missing> {
        let (v4, v6) = tokio::join!(
            self.lookup(name, RecordType::A),
            self.lookup(name, RecordType::AAAA)
        );
        let mut found = Addresses::default();
        let mut ttl: Option<Duration> = None;
        let mut empty = None;
        for (record_type, outcome) in [(RecordType::A, v4), (RecordType::AAAA, v6)] {
            match outcome {
                Ok(lookup) => {
                    found
                        .ips
                        .extend(lookup.answers().iter().filter_map(|r| address(&r.data)));
                    let this = ttl_of(&lookup);
                    ttl = Some(ttl.map_or(this, |earlier| earlier.min(this)));
                }
                Err(Missing::Empty(why)) => empty = empty.or(Some(why)),
                Err(Missing::Failed(kind, reason)) => found.failed.push(FailedLookup {
                    kind,
                    name: name.to_owned(),
                    family: if record_type == RecordType::A {
                        AddressFamily::A
                    } else {
                        AddressFamily::Aaaa
                    },
                    reason,
                }),
            }
        }
        match ttl {
            Some(ttl) if !found.ips.is_empty() => {
                found.ttl = ttl;
                Ok(found)
            }
            _ => match found.failed.first() {
                Some(failed) => Err(Missing::Failed(failed.kind, failed.to_string())),
                None => Err(Missing::Empty(empty.unwrap_or_else(|| "no records".into()))),
            },
        }
    }

    async fn lookup(&self, name: &str, kind: RecordType) -> Result<Lookup, Missing> {
        self.resolver
            .lookup(name, kind)
            .await
            .map_err(|e| classify(&e))
    }
}

/// The addresses in `lookup`'s additional section, by owner, as SRV target addresses.
fn add_addresses(answer: &mut Answer, lookup: &Lookup) {
    for record in lookup.additionals() {
        if let Some(ip) = address(&record.data) {
            answer
                .addresses
                .entry(target_key(&record.name.to_string()))
                .or_default()
                .push(ip);
        }
    }
}

fn address(data: &RData) -> Option<IpAddr> {
    match data {
        RData::A(a) => Some(IpAddr::V4(a.0)),
        RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
        _ => None,
    }
}

fn ttl_of(lookup: &Lookup) -> Duration {
    lookup
        .valid_until()
        .saturating_duration_since(Instant::now())
}

/// What a truncated answer is reported as: hickory's own words ("TCP already tried or no other
/// transport available") do not say that the fleet is too large for the name.
pub const TRUNCATED: &str = "the answer is truncated: too large for one DNS message (truncated over UDP, and not whole over TCP, which holds at most 65,535 bytes); split the fleet over several names";

/// NXDOMAIN and "no records" (NOERROR without answers) are empty answers; everything else —
/// SERVFAIL, REFUSED, a timeout, a truncated answer, a broken connection — is a failure, of its
/// kind.
fn classify(error: &NetError) -> Missing {
    match error {
        NetError::Dns(DnsError::NoRecordsFound(none)) => match none.response_code {
            ResponseCode::NXDomain => Missing::Empty("NXDOMAIN".into()),
            ResponseCode::NoError => Missing::Empty("no records".into()),
            code => Missing::Failed(FailureKind::Error, format!("response code {code}")),
        },
        NetError::Truncated => Missing::Failed(FailureKind::Truncated, TRUNCATED.into()),
        NetError::Timeout => Missing::Failed(FailureKind::Timeout, error.to_string()),
        other => Missing::Failed(FailureKind::Error, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::net::NoRecords;
    use hickory_resolver::proto::op::Query;

    fn outcome(error: NetError) -> Result<String, String> {
        match classify(&error) {
            Missing::Empty(why) => Ok(why),
            Missing::Failed(_, why) => Err(why),
        }
    }

    fn kind(error: NetError) -> Option<FailureKind> {
        match classify(&error) {
            Missing::Empty(_) => None,
            Missing::Failed(kind, _) => Some(kind),
        }
    }

    #[test]
    fn a_truncated_answer_and_a_timeout_are_failures_of_their_own_kind() {
        assert_eq!(kind(NetError::Truncated), Some(FailureKind::Truncated));
        assert_eq!(outcome(NetError::Truncated), Err(TRUNCATED.to_owned()));
        assert_eq!(kind(NetError::Timeout), Some(FailureKind::Timeout));
        let refused = NetError::Dns(DnsError::ResponseCode(ResponseCode::Refused));
        assert_eq!(kind(refused), Some(FailureKind::Error));
    }

    #[test]
    fn nxdomain_and_no_records_are_empty_everything_else_fails() {
        let none = |code| {
            NetError::Dns(DnsError::NoRecordsFound(NoRecords::new(
                Query::default(),
                code,
            )))
        };
        assert_eq!(outcome(none(ResponseCode::NXDomain)), Ok("NXDOMAIN".into()));
        assert_eq!(
            outcome(none(ResponseCode::NoError)),
            Ok("no records".into())
        );
        assert!(outcome(none(ResponseCode::ServFail)).is_err());
        let servfail = outcome(NetError::Dns(DnsError::ResponseCode(
            ResponseCode::ServFail,
        )));
        assert!(servfail.unwrap_err().contains("Server Failure"));
        assert!(outcome(NetError::Dns(DnsError::ResponseCode(ResponseCode::Refused))).is_err());
        assert!(outcome(NetError::Timeout).is_err());
    }
}
