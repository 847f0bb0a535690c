//! What the health prober and the load scraper share: every worker's target (a path from the
//! member or the configured default, joined to the worker's URL), rebuilt only when the
//! configuration or the merged membership in force changed (their `Arc`s, compared by pointer),
//! and the key of every per-worker map ([`WorkerKey`]).
//!
//! Shaped like pingora's health checks: a [`Check`] says what is asked of one worker, and
//! [`Targets`] owns the targets, their rebuild and which workers of the routing table have one;
//! [`TableKeys`] forgets the state of workers that left.
//! Each check keeps its own drive and its own notion of a status change: the prober asks each
//! worker once per interval at the worker's own offset of it, on the gateway's runtime, each
//! probe with its timeout, and flips health at its thresholds; the scraper asks within one round deadline on its own thread, over a kept-alive
//! connection per worker, and tracks freshness. The drain watcher is no check: it reads in-process
//! counters and has no target (docs/architecture.md).

mod key;

use std::collections::HashMap;
use std::sync::Arc;

use bch_core::router::{RoutingTable, Worker};
use http::Uri;

pub use key::{TableKeys, WorkerKey};

use crate::config::{Config, Member, SharedMembers};

/// One kind of per-worker check: what a worker is asked at, built once per configuration or
/// membership change, not per check.
pub trait Check {
    /// What one worker is checked at.
    type Target;

    /// The path asked of `member`: its own when it has one, else the configured default.
    fn path<'a>(config: &'a Config, member: &'a Member) -> &'a str;

    /// The target of `member` at `path`, given the URI the path makes on the member's URL
    /// (`None` when they make no valid URI).
    fn target(member: &Member, path: &str, uri: Option<Uri>) -> Self::Target;
}

/// Every worker's target for the check `C`, built for one configuration and membership.
pub struct Targets<C: Check> {
    /// The merged membership in force (static and discovered), read on every refresh.
    members: SharedMembers,
    /// The configuration and membership `by_worker` was built for.
    built_for: Option<(Arc<Config>, Arc<Vec<Member>>)>,
    by_worker: HashMap<WorkerKey, C::Target>,
}

impl<C: Check> Targets<C> {
    /// No targets yet: the first [`Targets::refresh`] builds them from `members`.
    pub fn new(members: SharedMembers) -> Self {
        Self {
            members,
            built_for: None,
            by_worker: HashMap::new(),
        }
    }

    /// Rebuilds every target when `config` or the membership in force is not the one they were
    /// built for; answers whether it did. Read the routing table before: the admin owner stores
    /// the membership before the table, so the membership read after it has every worker of the
    /// table but one that just left.
    pub fn refresh(&mut self, config: &Arc<Config>) -> bool {
        let membership = self.members.load_full();
        let fresh = self
            .built_for
            .as_ref()
            .is_some_and(|(c, m)| Arc::ptr_eq(c, config) && Arc::ptr_eq(m, &membership));
        if fresh {
            return false;
        }
        self.by_worker = membership
            .iter()
            .map(|member| {
                let path = C::path(config, member);
                let uri = path
                    .parse()
                    .ok()
                    .and_then(|path| member.url.join(Some(&path)).ok());
                let target = C::target(member, path, uri);
                (WorkerKey::of(&member.spec), target)
            })
            .collect();
        self.built_for = Some((Arc::clone(config), membership));
        true
    }

    /// The workers of `table` that have a target, with their keys, in table order. A worker that
    /// just left the membership has none: it is skipped, neither good nor failed.
    pub fn of_table<'t>(&self, table: &'t RoutingTable) -> Vec<(&'t Worker, WorkerKey)> {
        table
            .workers()
            .iter()
            .filter_map(|worker| {
                let (key, _) = self.by_worker.get_key_value(worker.spec.url.as_str())?;
                Some((worker, key.clone()))
            })
            .collect()
    }

    /// The target of `worker`.
    pub fn get(&self, worker: &WorkerKey) -> Option<&C::Target> {
        self.by_worker.get(worker)
    }

    /// Whether `worker` has a target.
    pub fn contains(&self, worker: &WorkerKey) -> bool {
        self.by_worker.contains_key(worker)
    }

    /// Forgets every target; the next [`Targets::refresh`] builds them again.
    pub fn clear(&mut self) {
        self.by_worker.clear();
        self.built_for = None;
    }
}

#[cfg(test)]
mod tests {
    use arc_swap::ArcSwap;

    use super::*;
    use crate::config::WorkerConfig;

    /// A check whose target is the URI it was given, as text.
    struct AskAt;

    impl Check for AskAt {
        type Target = Option<String>;

        fn path<'a>(config: &'a Config, member: &'a Member) -> &'a str {
            config.probe_path(member.health_path.as_deref())
        }

        fn target(_: &Member, _: &str, uri: Option<Uri>) -> Self::Target {
            uri.map(|uri| uri.to_string())
        }
    }

    fn member(url: &str, health_path: Option<&str>) -> Member {
        let mut entry = WorkerConfig::from_url(url);
        entry.health_path = health_path.map(str::to_owned);
        entry.member().unwrap()
    }

    #[test]
    fn targets_are_rebuilt_only_when_the_configuration_or_the_membership_changed() {
        let members = Arc::new(ArcSwap::from_pointee(vec![
            member("http://10.0.0.1:8000", None),
            member("http://10.0.0.2:8000/prefix", Some("/ready")),
        ]));
        let config = Arc::new(Config::default());
        let mut targets: Targets<AskAt> = Targets::new(Arc::clone(&members));
        assert!(targets.refresh(&config));
        assert!(
            !targets.refresh(&config),
            "same pointers: nothing to rebuild"
        );
        let first = WorkerKey::of(&members.load()[0].spec);
        let second = WorkerKey::of(&members.load()[1].spec);
        assert_eq!(
            targets.get(&first).cloned().flatten().as_deref(),
            Some("http://10.0.0.1:8000/health")
        );
        assert_eq!(
            targets.get(&second).cloned().flatten().as_deref(),
            Some("http://10.0.0.2:8000/prefix/ready")
        );
        // An equal configuration in a new `Arc` is a reload: rebuilt.
        assert!(targets.refresh(&Arc::new(Config::default())));
        members.store(Arc::new(vec![member("http://10.0.0.2:8000/prefix", None)]));
        let config = Arc::new(Config::default());
        assert!(targets.refresh(&config));
        assert!(
            !targets.contains(&first),
            "a worker that left has no target"
        );
        assert!(targets.contains(&second));
        targets.clear();
        assert!(!targets.contains(&second));
        assert!(targets.refresh(&config), "cleared: built again");
    }

    #[test]
    fn a_key_is_the_url_and_finds_its_worker_in_a_table() {
        let a = member("http://10.0.0.1:8000", None);
        let key = WorkerKey::of(&a.spec);
        assert!(key.is(&a.spec));
        assert_eq!(key.to_string(), "http://10.0.0.1:8000");
        let map: HashMap<WorkerKey, u32> = [(key.clone(), 7)].into();
        assert_eq!(map.get("http://10.0.0.1:8000"), Some(&7));
        let table = bch_core::router::Router::new(
            vec![member("http://10.0.0.9:8000", None).spec, a.spec.clone()],
            Default::default(),
        )
        .unwrap()
        .table();
        assert_eq!(key.index_in(&table), Some(1));
        let members = TableKeys::of(&table);
        assert!(members.contains(&key));
        assert!(!members.contains(&WorkerKey::of(&member("http://10.0.0.8:8000", None).spec)));
    }
}
