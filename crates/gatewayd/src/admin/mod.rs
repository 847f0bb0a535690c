//! The admin owner: the one place that changes membership and policy, for every source of change
//! — the admin API, the telemetry websocket, a configuration reload (`POST /admin/reload`, SIGHUP),
//! DNS discovery — so the configuration in force, the published worker endpoints and probe
//! targets, the router and telemetry always agree.
//!
//! The membership is built from two parts ([`membership`]): the static workers of the
//! configuration and the latest answer of each discovery source. Every change builds the next
//! configuration or the next discovered set and goes through one apply step: validate everything,
//! merge, publish the endpoints the new membership needs, then swap the router's table (workers
//! and policy together, one swap), the per-request settings, the configuration and the probe
//! targets. A refused change leaves all of it as it was; a change that changes nothing swaps
//! nothing (no ring rebuild, no `ring` frame). Changes are serialised by a lock that is only ever
//! held for this short, synchronous sequence, never by the data path.
//!
//! The apply step is in [`apply`]: prepare (every check, the merge, the router's prepared table)
//! then commit (cannot fail). Workers that leave keep their counters in [`departed`] for when they
//! come back. Draining a worker (and removing it once idle) is in [`drain`].

mod actor;
mod apply;
mod departed;
mod discovery_health;
mod discovery_status;
mod drain;
pub mod membership;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use bch_core::policy::{PolicyError, PolicyPatch, PolicySettings};
use bch_core::router::{MembershipError, Router, RouterError, RoutingTable, WorkerSpec};
use bch_core::telemetry::WorkerRecord;
use tokio::sync::{Notify, watch};

use crate::config::runtime::{RuntimeSettings, SharedSettings};
use crate::config::{
    Config, ConfigError, DiscoveryConfig, FieldError, Member, SharedConfig, SharedMembers,
    WorkerConfig,
};
use crate::error::GatewayError;
use crate::per_worker::WorkerKey;
use crate::telemetry::Telemetry;
use crate::tls::certificates::{ServedCertificates, TlsError};
use crate::upstream::Upstreams;
pub use actor::Actor;
use departed::Departed;
use discovery_status::HealthBoard;
pub use discovery_status::{ResolutionOutcome, StateChange};
use membership::DiscoveredSets;
pub use membership::DiscoveredWorker;

/// Changes applied to the configuration file's contents before it is put in force (the command
/// line's flags), at start-up and on every reload.
pub type ConfigOverrides = Arc<dyn Fn(&mut Config) + Send + Sync>;

/// Where the configuration in force comes from: the file (if any), then the overrides, then the
/// pinned workers (`--worker` flags, the demo's simulated workers), which every reload keeps.
#[derive(Clone)]
pub struct ConfigOrigin {
    /// The file to re-read on reload; `None` when started without one.
    pub path: Option<PathBuf>,
    /// Command-line overrides of file values.
    pub overrides: Option<ConfigOverrides>,
    /// Workers added after the file's, kept across reloads.
    pub pinned_workers: Vec<WorkerConfig>,
}

impl ConfigOrigin {
    /// The configuration `base` (the file's contents, or defaults) gives once the overrides and
    /// pinned workers are applied, validated.
    pub fn effective(&self, base: Config) -> Result<Config, ConfigError> {
        let config = self.effective_unvalidated(base);
        config.validate()?;
        Ok(config)
    }

    /// The configuration `base` gives once the overrides and pinned workers are applied, not yet
    /// validated: the start-up checks report every problem of it, not the first. The one place
    /// the file, the command line and the pinned workers are put together.
    pub fn effective_unvalidated(&self, mut base: Config) -> Config {
        if let Some(overrides) = &self.overrides {
            overrides(&mut base);
        }
        base.workers.extend(self.pinned_workers.iter().cloned());
        base
    }
}

/// Why the admin owner refused a change; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The configuration (file, or one built from the change) is invalid; names file and field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A reload's new certificate, key or client CA cannot be served; the old ones stay.
    #[error("{0}; the certificates in force are kept")]
    Tls(#[from] TlsError),
    /// A worker entry is invalid; names the field.
    #[error(transparent)]
    Worker(#[from] FieldError),
    /// The membership would break a uniqueness rule.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// A worker URL reaches the backend of another worker (the message names both).
    #[error("url: {0}")]
    Alias(String),
    /// A worker URL is one of this gateway's listeners.
    #[error("url: {0}")]
    Loop(String),
    /// The policy patch is invalid; names the field.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// No worker has this name.
    #[error("no worker named {0:?}")]
    UnknownWorker(String),
    /// The worker was found by DNS discovery; removed, it would be back on the next refresh.
    #[error(
        "worker {name:?} is discovered by dns:{dns}; it would come back on the next refresh: remove it from DNS, or the [[discovery]] entry"
    )]
    Discovered {
        /// The worker's name.
        name: String,
        /// The name it is discovered by.
        dns: String,
    },
    /// A reload was asked of a gateway started without a configuration file.
    #[error("gatewayd was started without --config; nothing to reload")]
    NoConfigFile,
}

impl From<RouterError> for AdminError {
    fn from(error: RouterError) -> Self {
        match error {
            RouterError::Policy(e) => AdminError::Policy(e),
            RouterError::Membership(e) => AdminError::Membership(e),
        }
    }
}

/// Each admin refusal keeps its kind in the answer: a bad worker is `invalid_worker`, a clash
/// `worker_conflict`, an unknown name `unknown_worker`, and so on.
impl From<AdminError> for GatewayError {
    fn from(error: AdminError) -> Self {
        match error {
            AdminError::Config(e) => GatewayError::InvalidConfig(e.to_string()),
            AdminError::Tls(_) => GatewayError::InvalidConfig(error.to_string()),
            AdminError::Worker(e) => GatewayError::InvalidWorker(e.to_string()),
            AdminError::Membership(MembershipError::UnknownWorker(name))
            | AdminError::UnknownWorker(name) => GatewayError::UnknownWorker(name),
            AdminError::Membership(MembershipError::Empty(_)) => {
                GatewayError::InvalidWorker(error.to_string())
            }
            AdminError::Membership(e) => GatewayError::WorkerConflict(e.to_string()),
            AdminError::Alias(_) => GatewayError::WorkerConflict(error.to_string()),
            AdminError::Loop(_) => GatewayError::InvalidWorker(error.to_string()),
            AdminError::Policy(e) => GatewayError::InvalidPolicy(e.to_string()),
            AdminError::NoConfigFile => GatewayError::NoConfigFile(error.to_string()),
            AdminError::Discovered { .. } => GatewayError::DiscoveredWorker(error.to_string()),
        }
    }
}

/// What a discovery source's answer did to the membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryChange {
    /// The answer is the set already in force: nothing was swapped.
    Unchanged,
    /// The membership changed: workers joined (by URL) and left.
    Changed {
        /// URLs of the workers that joined.
        joined: Vec<String>,
        /// URLs of the workers that left.
        left: Vec<String>,
    },
    /// The source is no longer configured as it was when it resolved (a reload came between):
    /// the answer was dropped.
    NotInForce,
}

/// The configuration in force and everything built from it, changed only under the admin lock.
struct InForce {
    config: Arc<Config>,
    /// The static workers of `config`, validated.
    statics: Vec<Member>,
    /// The latest accepted answer of each discovery source.
    discovered: DiscoveredSets,
    /// `statics` and `discovered` merged: what the router, the endpoints and the probes have.
    merged: Arc<Vec<Member>>,
    /// Discovered workers the merge in force left out (one of this gateway's listeners, a name
    /// and address both taken, an invalid member), by source canonical name.
    merge_skipped: HashMap<String, usize>,
    departed: Departed,
    /// Draining workers to remove from the membership once idle.
    remove_when_idle: HashSet<WorkerKey>,
}

/// The next state one change asks for.
struct Next {
    config: Arc<Config>,
    statics: Vec<Member>,
    discovered: DiscoveredSets,
}

/// The admin owner. See the module documentation.
pub struct Admin {
    router: Arc<Router>,
    upstreams: Arc<Upstreams>,
    telemetry: Telemetry,
    settings: SharedSettings,
    config: SharedConfig,
    members: SharedMembers,
    origin: ConfigOrigin,
    /// This gateway's bound listeners: no worker may be one of them.
    listeners: Vec<SocketAddr>,
    sources: watch::Sender<Vec<DiscoveryConfig>>,
    in_force: Mutex<InForce>,
    /// Notified on every membership change, so the prober probes new workers at once.
    probe_now: Arc<Notify>,
    /// Each discovery source's health, as its task last reported.
    health_board: HealthBoard,
    /// The TLS listeners' certificates, which a reload re-reads.
    certificates: Arc<ServedCertificates>,
}

/// The parts the admin owner writes to or tells about a change, besides those it builds itself
/// (settings, configuration and membership in force).
pub struct Owned {
    /// Membership, policy and worker states.
    pub router: Arc<Router>,
    /// The published worker endpoints.
    pub upstreams: Arc<Upstreams>,
    /// Told about policy changes.
    pub telemetry: Telemetry,
    /// Woken on a membership change, so new workers are probed at once.
    pub probe_now: Arc<Notify>,
}

impl Admin {
    /// The owner of a gateway whose router and endpoints (in `owned`) were built from `config`
    /// (already effective and validated) with its static workers `statics` and no discovered ones
    /// yet.
    pub fn new(owned: Owned, origin: ConfigOrigin, config: Config, statics: Vec<Member>) -> Self {
        let Owned {
            router,
            upstreams,
            telemetry,
            probe_now,
        } = owned;
        let merged = Arc::new(statics.clone());
        let (sources, _) = watch::channel(config.discovery.clone());
        let settings = Arc::new(ArcSwap::from_pointee(RuntimeSettings::from_config(&config)));
        let config = Arc::new(config);
        let in_force = InForce {
            config: Arc::clone(&config),
            statics,
            discovered: DiscoveredSets::default(),
            merged: Arc::clone(&merged),
            merge_skipped: HashMap::new(),
            departed: Departed::default(),
            remove_when_idle: HashSet::new(),
        };
        Self {
            router,
            upstreams,
            telemetry,
            settings,
            config: Arc::new(ArcSwap::new(config)),
            members: Arc::new(ArcSwap::new(merged)),
            origin,
            listeners: Vec::new(),
            sources,
            in_force: Mutex::new(in_force),
            probe_now,
            health_board: HealthBoard::default(),
            certificates: Arc::default(),
        }
    }

    /// Re-reads `certificates` on every reload (SIGHUP, `POST /admin/reload`).
    pub fn serving_certificates(mut self, certificates: Arc<ServedCertificates>) -> Self {
        self.certificates = certificates;
        self
    }

    /// Refuses from now on any worker whose URL is one of `listeners` (this gateway's own bound
    /// addresses): requests routed to it would loop. A discovered one is skipped with a warning.
    pub fn listening_on(mut self, listeners: Vec<SocketAddr>) -> Self {
        self.listeners = listeners;
        self
    }

    /// The per-request settings in force, for the data plane.
    pub fn settings(&self) -> SharedSettings {
        Arc::clone(&self.settings)
    }

    /// The configuration in force, for health probes.
    pub fn config(&self) -> SharedConfig {
        Arc::clone(&self.config)
    }

    /// The merged membership in force (with each worker's probe path), for health probes.
    pub fn members(&self) -> SharedMembers {
        Arc::clone(&self.members)
    }

    /// The workers added after the file's on every reload (`--worker`, the demo's), which a file
    /// written from the configuration in force must not list again.
    pub fn pinned_workers(&self) -> &[WorkerConfig] {
        &self.origin.pinned_workers
    }

    /// The `[[discovery]]` entries in force; changes on every reload that changes them.
    pub fn discovery_sources(&self) -> watch::Receiver<Vec<DiscoveryConfig>> {
        self.sources.subscribe()
    }

    /// Adds a static worker; answers its record. 400-class errors name the field; a clash with a
    /// registered static worker is a [`MembershipError`]. A discovered worker with the same URL
    /// becomes this static one.
    pub fn add_worker(
        &self,
        worker: WorkerConfig,
        actor: &Actor,
    ) -> Result<WorkerRecord, AdminError> {
        let member = worker.member()?;
        let name = member.spec.name.clone();
        let url = member.spec.url.clone();
        self.change(actor, |config, statics| {
            config.workers.push(worker);
            statics.push(member);
            Ok(())
        })?;
        tracing::info!(worker = %name, %url, client = actor.client_str(), "worker added");
        // A concurrent removal may have taken it out again already.
        self.record(&name)
    }

    /// The telemetry record of the worker called `name`.
    fn record(&self, name: &str) -> Result<WorkerRecord, AdminError> {
        self.router
            .table()
            .worker_records(crate::clock::now_ms())
            .into_iter()
            .find(|w| w.name == name)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))
    }

    /// Removes the static worker called `name` and answers its spec. Requests already routed to it
    /// keep their load guards and finish; no new request reaches it once this returns. A worker
    /// that DNS discovery has (alone or as well) is refused: it would come back.
    pub fn remove_worker(&self, name: &str, actor: &Actor) -> Result<WorkerSpec, AdminError> {
        let mut in_force = self.lock();
        let spec = self.remove_static(&mut in_force, name, actor)?;
        tracing::info!(worker = %spec.name, source = actor.source.as_str(), client = actor.client_str(), "worker removed");
        Ok(spec)
    }

    /// The worker called `name` if it is a member, refused if DNS discovery has it (alone or as
    /// well): removed, it would come back.
    fn removable<'a>(in_force: &'a InForce, name: &str) -> Result<&'a Member, AdminError> {
        let worker = in_force
            .merged
            .iter()
            .find(|m| m.spec.name == name)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))?;
        let discovered_by = match &worker.spec.source {
            bch_core::router::WorkerSource::Dns(dns) => Some(dns.clone()),
            bch_core::router::WorkerSource::Static => in_force
                .discovered
                .source_of(&in_force.config, &worker.spec.url)
                .map(|source| source.dns.clone()),
        };
        match discovered_by {
            Some(dns) => Err(AdminError::Discovered {
                name: name.to_owned(),
                dns,
            }),
            None => Ok(worker),
        }
    }

    /// Removes the static worker called `name` under the admin lock (see [`Admin::remove_worker`]).
    fn remove_static(
        &self,
        in_force: &mut InForce,
        name: &str,
        actor: &Actor,
    ) -> Result<WorkerSpec, AdminError> {
        let spec = Self::removable(in_force, name)?.spec.clone();
        let mut config = (*in_force.config).clone();
        config.workers.retain(|w| w.url != spec.url);
        let mut statics = in_force.statics.clone();
        statics.retain(|m| m.spec.url != spec.url);
        let next = Next {
            config: Arc::new(config),
            statics,
            discovered: in_force.discovered.clone(),
        };
        self.apply(in_force, next, actor)?;
        Ok(spec)
    }

    /// Applies a policy patch (any subset of kind, thresholds, virtual nodes, load source, spill
    /// order) and answers the policy in force; `actor` is logged and announced to telemetry
    /// clients.
    pub fn set_policy(
        &self,
        patch: &PolicyPatch,
        actor: &Actor,
    ) -> Result<PolicySettings, AdminError> {
        // The answer is the policy this change put in force, not whatever a concurrent change
        // left in the table a moment later.
        self.change(actor, |config, _| {
            let policy = config.policy_settings().patched(patch)?;
            config.set_policy_settings(policy);
            Ok(policy)
        })
    }

    /// Re-reads the configuration file and puts it in force (with the flags and pinned workers);
    /// on any error nothing changes. Discovered workers of sources that stay are kept; those of
    /// sources the file no longer has leave. Listener addresses and the admin token need a restart.
    pub fn reload(&self) -> Result<(), AdminError> {
        let path = self.origin.path.as_ref().ok_or(AdminError::NoConfigFile)?;
        let config = self.origin.effective(Config::load(path)?)?;
        // The files of `[upstream.tls]` are read again (a rotated client certificate, a new CA);
        // ones that cannot be used refuse the reload, the configuration in force stays.
        let worker_tls =
            crate::upstream::tls::client_config(&config.upstream.tls).map_err(|e| {
                ConfigError::Invalid {
                    path: Some(path.clone()),
                    error: e.field_error(),
                }
            })?;
        let statics = config.members()?;
        // Certificates first: a file that cannot be served refuses the whole reload, before
        // anything changed.
        let certificates = self.certificates.reload(&config)?;
        let mut in_force = self.lock();
        let mut discovered = in_force.discovered.clone();
        discovered.retain_configured(&config);
        let next = Next {
            config: Arc::new(config),
            statics,
            discovered,
        };
        let before = Arc::clone(&in_force.config);
        self.apply(&mut in_force, next, &Actor::reload())?;
        certificates.put_in_force();
        self.upstreams.tls().replace(worker_tls);
        let diff = crate::config::diff::describe(&before, &in_force.config);
        tracing::info!(path = %path.display(), changes = %diff, "configuration reloaded");
        Ok(())
    }

    /// Puts a discovery source's answer in force: `workers` become the source's set, merged with
    /// the static workers and the other sources'. An answer equal to the set in force changes
    /// nothing at all. `source` is the entry as the resolving task had it; if a reload changed or
    /// removed it since, the answer is dropped ([`DiscoveryChange::NotInForce`]).
    pub fn apply_discovered(
        &self,
        source: &DiscoveryConfig,
        workers: Vec<DiscoveredWorker>,
    ) -> Result<DiscoveryChange, AdminError> {
        let mut in_force = self.lock();
        if !in_force.config.discovery.contains(source) {
            return Ok(DiscoveryChange::NotInForce);
        }
        let mut discovered = in_force.discovered.clone();
        if !discovered.replace(source, workers) {
            return Ok(DiscoveryChange::Unchanged);
        }
        let before = self.router.table();
        let next = Next {
            config: Arc::clone(&in_force.config),
            statics: in_force.statics.clone(),
            discovered,
        };
        self.apply(&mut in_force, next, &Actor::discovery())?;
        let (joined, left) = url_changes(&before, &self.router.table());
        Ok(DiscoveryChange::Changed { joined, left })
    }

    /// Workers of `source`'s accepted set that the membership in force left out (see
    /// [`InForce`]): skipped records too, for `bch_discovery_skipped_records`.
    pub fn merge_skipped(&self, source: &DiscoveryConfig) -> usize {
        self.lock()
            .merge_skipped
            .get(&source.canonical_name())
            .copied()
            .unwrap_or(0)
    }

    /// Workers in the set last accepted for `source` (0 when none was).
    pub fn discovered_count(&self, source: &DiscoveryConfig) -> usize {
        self.lock().discovered.get(source).len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InForce> {
        self.in_force.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Edits a copy of the configuration in force (and its static members, in step) and applies
    /// it; answers what `edit` answered.
    fn change<T>(
        &self,
        actor: &Actor,
        edit: impl FnOnce(&mut Config, &mut Vec<Member>) -> Result<T, AdminError>,
    ) -> Result<T, AdminError> {
        let mut in_force = self.lock();
        let mut config = (*in_force.config).clone();
        let mut statics = in_force.statics.clone();
        let answer = edit(&mut config, &mut statics)?;
        let next = Next {
            config: Arc::new(config),
            statics,
            discovered: in_force.discovered.clone(),
        };
        self.apply(&mut in_force, next, actor)?;
        Ok(answer)
    }
}

/// URLs that joined and left between two tables.
fn url_changes(before: &RoutingTable, after: &RoutingTable) -> (Vec<String>, Vec<String>) {
    let urls = |t: &RoutingTable| -> std::collections::HashSet<String> {
        t.workers().iter().map(|w| w.spec.url.clone()).collect()
    };
    let (old, new) = (urls(before), urls(after));
    let mut joined: Vec<String> = new.difference(&old).cloned().collect();
    let mut left: Vec<String> = old.difference(&new).cloned().collect();
    joined.sort();
    left.sort();
    (joined, left)
}
