//! The membership in force, built from its parts: the static workers (configuration file, flags,
//! admin API) first, in configuration order, then each discovery source's workers in
//! `[[discovery]]` order, each source's sorted by address.
//!
//! Pure and deterministic: every gateway replica with the same configuration and the same DNS
//! answers builds the same list, so the same ring, whatever order the answers came in. A
//! discovered worker whose URL a static worker (or an earlier source) already has is that worker,
//! not a second one; the configured entry wins, with its name and probe path.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use crate::config::alias::Backend;
use crate::config::members::loop_of;
use crate::config::{Config, DiscoveryConfig, Member, WorkerConfig, WorkerUrl, check_name};

/// One worker as a DNS answer gave it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DiscoveredWorker {
    /// Its address and port; the URL is `scheme://addr`, and that URL is its ring identity.
    pub addr: SocketAddr,
    /// The readable name the answer gave it (an SRV target without its trailing dot), when that
    /// name stands for this one worker only; `None`: the worker is called `IP:PORT`.
    pub name: Option<String>,
}

impl DiscoveredWorker {
    /// The URL a worker found by `source` gets.
    pub fn url(&self, source: &DiscoveryConfig) -> String {
        format!("{}://{}", source.scheme, self.addr)
    }

    /// The name an https worker found by `source` is checked against: the source's
    /// `server_name`, else the SRV target that names this worker alone, else the source's DNS name
    /// without its `_service._proto.` labels. `None` for http workers.
    pub fn server_name(&self, source: &DiscoveryConfig) -> Option<String> {
        if source.scheme != "https" {
            return None;
        }
        let fallback = || {
            let mut labels = source.dns.trim_end_matches('.').split('.').peekable();
            while labels.next_if(|label| label.starts_with('_')).is_some() {}
            labels.collect::<Vec<_>>().join(".")
        };
        Some(
            source
                .server_name
                .clone()
                .or_else(|| self.name.clone())
                .unwrap_or_else(fallback),
        )
    }
}

/// The latest accepted answer of every discovery source, by the source's canonical name; each set
/// sorted and free of duplicate addresses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiscoveredSets {
    sets: HashMap<String, Vec<DiscoveredWorker>>,
}

impl DiscoveredSets {
    /// The set last accepted for `source` (empty when none was).
    pub fn get(&self, source: &DiscoveryConfig) -> &[DiscoveredWorker] {
        self.sets
            .get(&source.canonical_name())
            .map_or(&[], Vec::as_slice)
    }

    /// Replaces `source`'s set (sorted and deduplicated here); answers whether it changed.
    pub fn replace(
        &mut self,
        source: &DiscoveryConfig,
        mut workers: Vec<DiscoveredWorker>,
    ) -> bool {
        workers.sort();
        workers.dedup_by(|a, b| a.addr == b.addr);
        let name = source.canonical_name();
        // A source without a set has the empty one: an empty answer again changes nothing.
        if self.sets.get(&name).map_or(&[][..], Vec::as_slice) == workers.as_slice() {
            return false;
        }
        if workers.is_empty() {
            self.sets.remove(&name);
        } else {
            self.sets.insert(name, workers);
        }
        true
    }

    /// Forgets every set whose source `config` no longer has.
    pub fn retain_configured(&mut self, config: &Config) {
        let names: HashSet<String> = config
            .discovery
            .iter()
            .map(DiscoveryConfig::canonical_name)
            .collect();
        self.sets.retain(|name, _| names.contains(name));
    }

    /// The source (of `config`) whose set has a worker at `url`, if any.
    pub fn source_of<'a>(&self, config: &'a Config, url: &str) -> Option<&'a DiscoveryConfig> {
        config
            .discovery
            .iter()
            .find(|source| self.get(source).iter().any(|w| w.url(source) == url))
    }
}

/// The merged membership and the discovered workers that could not join it, as warnings.
#[derive(Debug, Clone, Default)]
pub struct Merged {
    /// Static workers first, then each source's.
    pub members: Vec<Member>,
    /// One sentence per discovered worker left out, naming it and why.
    pub skipped: Vec<String>,
    /// How many of each source's workers were left out, by the source's canonical name (only
    /// sources with some): counted with the records its answer had that could not be used.
    pub skipped_by_source: HashMap<String, usize>,
}

/// Merges `statics` (the validated static workers of `config`) with `discovered`, leaving out
/// (with a reason) any discovered worker that is one of this gateway's `listeners`; see the module
/// documentation for the order and the rules.
pub fn merge(
    statics: &[Member],
    config: &Config,
    discovered: &DiscoveredSets,
    listeners: &[SocketAddr],
) -> Merged {
    let mut members: Vec<Member> = statics.to_vec();
    let mut names: HashSet<String> = members.iter().map(|m| m.spec.name.clone()).collect();
    let mut urls: HashSet<String> = members.iter().map(|m| m.spec.url.clone()).collect();
    // A set, not a scan of the members per discovered worker: a 1,000-record answer would
    // otherwise compare a million backends.
    let mut backends: HashSet<Backend> = members.iter().map(|m| m.url.backend.clone()).collect();
    let mut skipped = Vec::new();
    let mut skipped_by_source: HashMap<String, usize> = HashMap::new();
    for source in &config.discovery {
        let before = skipped.len();
        for worker in discovered.get(source) {
            let url = worker.url(source);
            let authority = worker.addr.to_string();
            // A static `http://10.0.0.7:8000/` is the worker DNS reports as 10.0.0.7:8000.
            let same_backend =
                WorkerUrl::parse(&url).is_ok_and(|parsed| backends.contains(&parsed.backend));
            if urls.contains(&url) || same_backend {
                continue;
            }
            let name = match &worker.name {
                // A DNS name outside the worker-name grammar (an internationalised name shown
                // in Unicode, an escaped byte) leaves the worker its address for a name.
                Some(name) if !names.contains(name) && check_name(name).is_ok() => name.clone(),
                _ if !names.contains(&authority) => authority.clone(),
                _ => {
                    skipped.push(format!(
                        "worker {url} found by dns:{}: its name and its address {authority} are both taken by other workers; skipped",
                        source.dns
                    ));
                    continue;
                }
            };
            match discovered_member(source, &name, &url, worker.server_name(source)) {
                Ok(member) => {
                    if let Some(why) = loop_of(&member, listeners) {
                        skipped.push(format!(
                            "worker found by dns:{}: {why}; skipped",
                            source.dns
                        ));
                        continue;
                    }
                    names.insert(name);
                    urls.insert(url);
                    backends.insert(member.url.backend.clone());
                    members.push(member);
                }
                Err(why) => skipped.push(format!(
                    "worker {url} found by dns:{}: {why}; skipped",
                    source.dns
                )),
            }
        }
        if skipped.len() > before {
            *skipped_by_source
                .entry(source.canonical_name())
                .or_default() += skipped.len() - before;
        }
    }
    Merged {
        members,
        skipped,
        skipped_by_source,
    }
}

/// A discovered worker as a validated member: the same checks as a configured one.
fn discovered_member(
    source: &DiscoveryConfig,
    name: &str,
    url: &str,
    server_name: Option<String>,
) -> Result<Member, crate::config::FieldError> {
    let entry = WorkerConfig {
        name: Some(name.to_owned()),
        url: url.to_owned(),
        ring_id: None,
        health_path: source.health_path.clone(),
        metrics_path: source.metrics_path.clone(),
        max_in_flight: source.max_in_flight,
        server_name,
        models: source.models.clone(),
    };
    let mut member = entry.member()?;
    member.spec.source = source.source();
    Ok(member)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_core::router::WorkerSource;

    fn at(addr: &str, name: Option<&str>) -> DiscoveredWorker {
        DiscoveredWorker {
            addr: addr.parse().unwrap(),
            name: name.map(str::to_owned),
        }
    }

    fn config(statics: &[&str], sources: &[&str]) -> Config {
        Config {
            workers: statics.iter().map(|u| WorkerConfig::from_url(u)).collect(),
            discovery: sources.iter().map(|d| DiscoveryConfig::new(d)).collect(),
            ..Config::default()
        }
    }

    #[test]
    fn a_sources_models_are_every_discovered_workers() {
        let mut config = config(&[], &["_a._tcp.x"]);
        config.discovery[0].models = vec!["llama".into(), "qwen".into()];
        let mut sets = DiscoveredSets::default();
        let source = config.discovery[0].clone();
        sets.replace(
            &source,
            vec![at("10.0.0.1:8000", None), at("10.0.0.2:8000", None)],
        );
        let merged = merge(&[], &config, &sets, &[]);
        assert_eq!(merged.members.len(), 2);
        for member in &merged.members {
            assert_eq!(member.spec.models, ["llama", "qwen"]);
        }
    }

    #[test]
    fn an_empty_answer_for_an_empty_source_changes_nothing() {
        let source = DiscoveryConfig::new("llm.test");
        let mut sets = DiscoveredSets::default();
        assert!(
            !sets.replace(&source, Vec::new()),
            "a source with no set that answers empty again is unchanged (no rebuild, no log line)"
        );
        assert!(sets.replace(&source, vec![at("10.0.0.1:8000", None)]));
        assert!(sets.replace(&source, Vec::new()));
        assert!(!sets.replace(&source, Vec::new()));
    }

    fn names(merged: &Merged) -> Vec<(&str, &str, String)> {
        merged
            .members
            .iter()
            .map(|m| {
                (
                    m.spec.name.as_str(),
                    m.spec.url.as_str(),
                    m.spec.source.label().into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn statics_first_then_sources_in_order_each_sorted_and_one_worker_per_url() {
        let config = config(&["http://10.0.0.2:8000/"], &["_a._tcp.x", "_b._tcp.x"]);
        let statics = config.members().unwrap();
        let mut sets = DiscoveredSets::default();
        let (a, b) = (&config.discovery[0], &config.discovery[1]);
        assert!(sets.replace(
            a,
            vec![at("10.0.0.9:8000", Some("w9.x")), at("10.0.0.2:8000", None)]
        ));
        assert!(sets.replace(
            b,
            vec![
                at("10.0.0.9:8000", None),
                at("10.0.0.10:8000", Some("w9.x"))
            ]
        ));
        assert!(
            !sets.replace(
                a,
                vec![at("10.0.0.2:8000", None), at("10.0.0.9:8000", Some("w9.x"))]
            ),
            "same set, other order"
        );
        let merged = merge(&statics, &config, &sets, &[]);
        assert_eq!(
            names(&merged),
            [
                (
                    "10.0.0.2:8000",
                    "http://10.0.0.2:8000/",
                    "static".to_owned()
                ),
                ("w9.x", "http://10.0.0.9:8000", "dns:_a._tcp.x".to_owned()),
                (
                    "10.0.0.10:8000",
                    "http://10.0.0.10:8000",
                    "dns:_b._tcp.x".to_owned()
                ),
            ],
            "the static URL and the second source's 10.0.0.9 are the same workers; w9.x was taken"
        );
        assert!(merged.skipped.is_empty());
        assert_eq!(sets.source_of(&config, "http://10.0.0.9:8000"), Some(a));
        assert_eq!(
            merged.members[1].spec.source,
            WorkerSource::Dns("_a._tcp.x".into())
        );
    }

    #[test]
    fn discovered_workers_take_their_sources_probe_and_metrics_paths() {
        let mut config = config(&[], &["_a._tcp.x", "_b._tcp.x"]);
        config.discovery[0].health_path = Some("/v1/models".into());
        config.discovery[0].metrics_path = Some("/engine/metrics".into());
        let mut sets = DiscoveredSets::default();
        sets.replace(&config.discovery[0], vec![at("10.0.0.1:8000", None)]);
        sets.replace(&config.discovery[1], vec![at("10.0.0.2:8000", None)]);
        let merged = merge(&[], &config, &sets, &[]);
        let paths: Vec<_> = merged
            .members
            .iter()
            .map(|m| (m.health_path.as_deref(), m.metrics_path.as_deref()))
            .collect();
        assert_eq!(
            paths,
            [(Some("/v1/models"), Some("/engine/metrics")), (None, None)],
            "the second source's workers use [health] path and [load] metrics_path"
        );
    }

    #[test]
    fn a_worker_whose_name_and_address_are_both_taken_is_skipped_with_a_reason() {
        let mut config = config(&[], &["_a._tcp.x"]);
        config.workers.push(WorkerConfig {
            name: Some("10.0.0.5:80".into()),
            ..WorkerConfig::from_url("http://10.0.0.6:80")
        });
        config.workers.push(WorkerConfig {
            name: Some("w.x".into()),
            ..WorkerConfig::from_url("http://10.0.0.7:80")
        });
        let statics = config.members().unwrap();
        let mut sets = DiscoveredSets::default();
        sets.replace(&config.discovery[0], vec![at("10.0.0.5:80", Some("w.x"))]);
        let merged = merge(&statics, &config, &sets, &[]);
        assert_eq!(merged.members.len(), 2);
        assert_eq!(merged.skipped.len(), 1);
        assert!(
            merged.skipped[0].contains("http://10.0.0.5:80"),
            "{:?}",
            merged.skipped
        );
    }

    #[test]
    fn a_dns_name_outside_the_worker_name_grammar_leaves_the_worker_its_address() {
        let config = config(&[], &["_a._tcp.x"]);
        let mut sets = DiscoveredSets::default();
        sets.replace(
            &config.discovery[0],
            vec![
                at("10.0.0.5:80", Some("b\u{fc}cher.x")),
                at("10.0.0.6:80", Some("w\\032x.x")),
            ],
        );
        let merged = merge(&[], &config, &sets, &[]);
        let names: Vec<&str> = merged
            .members
            .iter()
            .map(|m| m.spec.name.as_str())
            .collect();
        assert_eq!(names, ["10.0.0.5:80", "10.0.0.6:80"]);
        assert!(merged.skipped.is_empty(), "{:?}", merged.skipped);
    }

    #[test]
    fn sets_of_sources_no_longer_configured_are_forgotten() {
        let mut config = config(&[], &["_a._tcp.x"]);
        let mut sets = DiscoveredSets::default();
        sets.replace(&config.discovery[0], vec![at("10.0.0.5:80", None)]);
        config.discovery[0].dns = "_A._tcp.x.".into();
        sets.retain_configured(&config);
        assert_eq!(
            sets.get(&config.discovery[0]).len(),
            1,
            "the same name, spelled otherwise"
        );
        config.discovery.clear();
        sets.retain_configured(&config);
        assert_eq!(sets, DiscoveredSets::default());
    }
}
