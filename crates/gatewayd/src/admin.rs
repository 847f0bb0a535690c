//! The admin owner: the one place that changes membership and policy, for every source of change
//! — the admin API, the telemetry websocket, a configuration reload (`POST /admin/reload`, SIGHUP)
//! — so the configuration in force, the published worker endpoints, the router and telemetry
//! always agree.
//!
//! Every change builds the next configuration and goes through [`Admin::apply`]: validate
//! everything, publish the endpoints the new membership needs, then swap the router's table
//! (workers and policy together, one swap), the per-request settings and the configuration. A
//! refused change leaves all of it as it was. Changes are serialised by a lock that is only ever
//! held for this short, synchronous sequence, never by the data path.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use bch_core::policy::{PolicyError, PolicyPatch, PolicySettings};
use bch_core::router::{MembershipError, Router, RouterError, WorkerSpec, validate_membership};
use bch_core::telemetry::{ChangeSource, WorkerRecord, WorkerState};
use tokio::sync::Notify;

use crate::config::runtime::{RuntimeSettings, SharedSettings};
use crate::config::{
    Config, ConfigError, Member, SharedConfig, WorkerConfig, WorkerError, alias_of, loop_of,
};
use crate::error::GatewayError;
use crate::telemetry::Telemetry;
use crate::upstream::Upstreams;

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
    pub fn effective(&self, mut base: Config) -> Result<Config, ConfigError> {
        if let Some(overrides) = &self.overrides {
            overrides(&mut base);
        }
        base.workers.extend(self.pinned_workers.iter().cloned());
        base.validate()?;
        Ok(base)
    }
}

/// Who asks for a change: the channel (`ws`, `http`, `reload`) and, for the first two, the
/// client's address, so the log and the telemetry frame can name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The channel the change came through.
    pub source: ChangeSource,
    /// The peer address of the client (`None` for a reload or an unknown peer).
    pub client: Option<String>,
}

impl Actor {
    /// A change made by a configuration reload (SIGHUP or `POST /admin/reload`).
    pub fn reload() -> Self {
        Actor {
            source: ChangeSource::Reload,
            client: None,
        }
    }

    /// A change made through `source` by the client at `client`.
    pub fn client(source: ChangeSource, client: Option<std::net::SocketAddr>) -> Self {
        Actor {
            source,
            client: client.map(|a| a.to_string()),
        }
    }

    fn client_str(&self) -> &str {
        self.client.as_deref().unwrap_or("-")
    }
}

/// Why the admin owner refused a change; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The configuration (file, or one built from the change) is invalid; names file and field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A worker entry is invalid; names the field.
    #[error(transparent)]
    Worker(#[from] WorkerError),
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

impl From<AdminError> for GatewayError {
    fn from(error: AdminError) -> Self {
        match error {
            AdminError::Config(e) => GatewayError::InvalidConfig(e.to_string()),
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
        }
    }
}

/// The configuration in force and its validated workers, changed only under the admin lock.
struct InForce {
    config: Arc<Config>,
    members: Vec<Member>,
    /// Draining workers (by name) to remove from the membership once idle.
    remove_when_idle: HashSet<String>,
}

/// The admin owner. See the module documentation.
pub struct Admin {
    router: Arc<Router>,
    upstreams: Arc<Upstreams>,
    telemetry: Telemetry,
    settings: SharedSettings,
    config: SharedConfig,
    origin: ConfigOrigin,
    /// This gateway's bound listeners: no worker may be one of them.
    listeners: Vec<SocketAddr>,
    in_force: Mutex<InForce>,
    /// Notified on every membership change, so the prober probes new workers at once.
    probe_now: Arc<Notify>,
}

/// Everything the admin owner writes to or tells about a change.
pub struct Owned {
    /// Membership, policy and worker states.
    pub router: Arc<Router>,
    /// The published worker endpoints.
    pub upstreams: Arc<Upstreams>,
    /// Told about policy changes.
    pub telemetry: Telemetry,
    /// The per-request settings.
    pub settings: SharedSettings,
    /// The configuration in force, for its readers.
    pub config: SharedConfig,
    /// Woken on a membership change, so new workers are probed at once.
    pub probe_now: Arc<Notify>,
}

impl Admin {
    /// The owner of a gateway whose router, endpoints, settings and shared configuration were
    /// built from the configuration in `owned.config` (already effective and validated) with
    /// `members`.
    pub fn new(owned: Owned, origin: ConfigOrigin, members: Vec<Member>) -> Self {
        let Owned {
            router,
            upstreams,
            telemetry,
            settings,
            config,
            probe_now,
        } = owned;
        let in_force = InForce {
            config: config.load_full(),
            members,
            remove_when_idle: HashSet::new(),
        };
        Self {
            router,
            upstreams,
            telemetry,
            settings,
            config,
            origin,
            listeners: Vec::new(),
            in_force: Mutex::new(in_force),
            probe_now,
        }
    }

    /// Refuses from now on any worker whose URL is one of `listeners` (this gateway's own bound
    /// addresses): requests routed to it would loop.
    pub fn listening_on(mut self, listeners: Vec<SocketAddr>) -> Self {
        self.listeners = listeners;
        self
    }

    /// The configuration in force (runtime changes included), for `GET /admin/config`.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.lock().config)
    }

    /// The workers added after the file's on every reload (`--worker`, the demo's), which a file
    /// written from the configuration in force must not list again.
    pub fn pinned_workers(&self) -> &[WorkerConfig] {
        &self.origin.pinned_workers
    }

    /// Stops routing new requests to the worker called `name` (it stays a member, listed with its
    /// in-flight count and state `draining`); with `remove_when_idle` it leaves the membership
    /// once its last request ended. Draining a draining worker updates `remove_when_idle`.
    pub fn drain(
        &self,
        name: &str,
        remove_when_idle: bool,
        actor: &Actor,
    ) -> Result<WorkerRecord, AdminError> {
        let mut in_force = self.lock();
        let changed = self
            .router
            .set_state(name, WorkerState::Draining)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))?;
        if remove_when_idle {
            in_force.remove_when_idle.insert(name.to_owned());
        } else {
            in_force.remove_when_idle.remove(name);
        }
        drop(in_force);
        let record = self.record(name)?;
        if changed {
            tracing::info!(worker = %name, active = record.active, remove_when_idle, source = actor.source.as_str(), client = actor.client_str(), "worker draining: no new requests");
        }
        Ok(record)
    }

    /// Routes new requests to a draining worker again and cancels a pending removal.
    pub fn undrain(&self, name: &str, actor: &Actor) -> Result<WorkerRecord, AdminError> {
        let mut in_force = self.lock();
        let changed = self
            .router
            .set_state(name, WorkerState::Active)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))?;
        in_force.remove_when_idle.remove(name);
        drop(in_force);
        if changed {
            tracing::info!(worker = %name, source = actor.source.as_str(), client = actor.client_str(), "worker undrained: takes new requests again");
        }
        self.record(name)
    }

    /// Called when the draining worker `name` was seen idle: removes it if its drain asked for
    /// that. `None` when it is no longer a draining member with nothing in flight (undrained,
    /// removed, or busy after all); else whether it was removed.
    pub fn finish_drain(&self, name: &str) -> Option<bool> {
        let mut in_force = self.lock();
        let table = self.router.table();
        let index = table.index_of(name)?;
        let idle = table.workers()[index].stats.active() == 0;
        if table.states()[index] != WorkerState::Draining || !idle {
            return None;
        }
        if !in_force.remove_when_idle.remove(name) {
            return Some(false);
        }
        let mut config = (*in_force.config).clone();
        let mut members = in_force.members.clone();
        let position = members.iter().position(|m| m.spec.name == name)?;
        let member = members.remove(position);
        config.workers.retain(|w| w.url != member.spec.url);
        match self.apply(&mut in_force, config, members, &Actor::reload()) {
            Ok(()) => Some(true),
            Err(error) => {
                tracing::warn!(worker = %name, %error, "drained worker could not be removed");
                Some(false)
            }
        }
    }

    fn record(&self, name: &str) -> Result<WorkerRecord, AdminError> {
        self.router
            .table()
            .worker_records()
            .into_iter()
            .find(|w| w.name == name)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))
    }

    /// Adds a worker; answers its record. 400-class errors name the field; a clash with a
    /// registered worker is a [`MembershipError`].
    pub fn add_worker(
        &self,
        worker: WorkerConfig,
        actor: &Actor,
    ) -> Result<WorkerRecord, AdminError> {
        let member = worker.member()?;
        let name = member.spec.name.clone();
        let url = member.spec.url.clone();
        self.change(actor, |config, members| {
            config.workers.push(worker);
            members.push(member);
            Ok(())
        })?;
        tracing::info!(worker = %name, %url, client = actor.client_str(), "worker added");
        // A concurrent removal may have taken it out again already.
        self.record(&name)
    }

    /// Removes the worker called `name` and answers its spec. Requests already routed to it keep
    /// their load guards and finish; no new request reaches it once this returns.
    pub fn remove_worker(&self, name: &str, actor: &Actor) -> Result<WorkerSpec, AdminError> {
        let mut removed = None;
        self.change(actor, |config, members| {
            let index = members
                .iter()
                .position(|m| m.spec.name == name)
                .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))?;
            let member = members.remove(index);
            config.workers.retain(|w| w.url != member.spec.url);
            removed = Some(member.spec);
            Ok(())
        })?;
        let spec = removed.expect("set when the change succeeded");
        tracing::info!(worker = %spec.name, client = actor.client_str(), "worker removed");
        Ok(spec)
    }

    /// Applies a policy patch (any subset of kind, thresholds, virtual nodes) and answers the
    /// policy in force; `source` is announced to telemetry clients.
    pub fn set_policy(
        &self,
        patch: &PolicyPatch,
        actor: &Actor,
    ) -> Result<PolicySettings, AdminError> {
        // The answer is the policy this change put in force, not whatever a concurrent change
        // left in the table a moment later.
        self.change(actor, |config, _| {
            let policy = config.policy.settings().patched(patch)?;
            config.policy.kind = policy.kind;
            config.policy.min_load_gap = policy.min_load_gap;
            config.policy.max_load_skew = policy.max_load_skew;
            config.policy.virtual_nodes = policy.virtual_nodes;
            Ok(policy)
        })
    }

    /// Re-reads the configuration file and puts it in force (with the flags and pinned workers);
    /// on any error nothing changes. Listener addresses and the admin token need a restart.
    pub fn reload(&self) -> Result<(), AdminError> {
        let path = self.origin.path.as_ref().ok_or(AdminError::NoConfigFile)?;
        let config = self.origin.effective(Config::load(path)?)?;
        let members = config.members()?;
        let mut in_force = self.lock();
        let before = Arc::clone(&in_force.config);
        self.apply(&mut in_force, config, members, &Actor::reload())?;
        let diff = crate::config::diff::describe(&before, &in_force.config);
        tracing::info!(path = %path.display(), changes = %diff, "configuration reloaded");
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InForce> {
        self.in_force.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Edits a copy of the configuration in force (and its members, in step) and applies it;
    /// answers what `edit` answered.
    fn change<T>(
        &self,
        actor: &Actor,
        edit: impl FnOnce(&mut Config, &mut Vec<Member>) -> Result<T, AdminError>,
    ) -> Result<T, AdminError> {
        let mut in_force = self.lock();
        let mut config = (*in_force.config).clone();
        let mut members = in_force.members.clone();
        let answer = edit(&mut config, &mut members)?;
        self.apply(&mut in_force, config, members, actor)?;
        Ok(answer)
    }

    /// The one path of every change: validate, publish endpoints, swap the router's table, the
    /// settings and the configuration, announce a policy change.
    fn apply(
        &self,
        in_force: &mut InForce,
        config: Config,
        members: Vec<Member>,
        actor: &Actor,
    ) -> Result<(), AdminError> {
        let specs: Vec<WorkerSpec> = members.iter().map(|m| m.spec.clone()).collect();
        let policy = config.policy.settings();
        validate_membership(&specs)?;
        for (index, member) in members.iter().enumerate() {
            if let Some(message) = alias_of(member, &members[..index]) {
                return Err(AdminError::Alias(message));
            }
            if let Some(message) = loop_of(member, &self.listeners) {
                return Err(AdminError::Loop(message));
            }
        }
        policy.validate()?;
        let table = self.router.table();
        let before = *table.policy();
        let same_members = table.workers().len() == specs.len()
            && table
                .workers()
                .iter()
                .zip(&specs)
                .all(|(w, s)| w.spec == *s);
        if same_members {
            // Thresholds and kind reuse the ring (a new `virtual_nodes` rebuilds it): no ring
            // rebuild, no new membership generation, no `ring` frame for a policy change.
            if policy != before {
                self.router.set_policy(&PolicyPatch::from(policy))?;
            }
        } else {
            // Endpoints first: every table the router publishes finds its workers' endpoints.
            self.upstreams.publish(&members);
            self.router
                .set_initial_health(!config.health.wait_for_first_probe);
            if let Err(error) = self.router.reconfigure(specs, policy) {
                self.upstreams.publish(&in_force.members);
                return Err(error.into());
            }
            self.probe_now.notify_one();
        }
        self.settings
            .store(Arc::new(RuntimeSettings::from_config(&config)));
        let config = Arc::new(config);
        self.config.store(Arc::clone(&config));
        in_force.config = config;
        in_force.members = members;
        let table = self.router.table();
        in_force
            .remove_when_idle
            .retain(|name| table.index_of(name).is_some());
        if policy != before {
            tracing::info!(source = actor.source.as_str(), client = actor.client_str(), kind = %policy.kind, min_load_gap = policy.min_load_gap, max_load_skew = policy.max_load_skew, virtual_nodes = policy.virtual_nodes, previous_kind = %before.kind, previous_min_load_gap = before.min_load_gap, previous_max_load_skew = before.max_load_skew, "policy changed");
            self.telemetry
                .policy_changed(actor.source, actor.client.clone());
        }
        Ok(())
    }
}
