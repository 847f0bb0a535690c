//! The one apply step of every change (see the module documentation of `admin`): prepare, which
//! takes every step that can refuse the change and changes nothing, then commit, which cannot
//! fail, so nothing is ever rolled back.

use std::collections::HashMap;
use std::sync::Arc;

use bch_core::policy::PolicySettings;
use bch_core::router::{PreparedTable, WorkerSpec, validate_membership};

use super::membership::merge;
use super::{Actor, Admin, AdminError, InForce, Next};
use crate::config::members::{first_alias, loop_of};
use crate::config::runtime::RuntimeSettings;
use crate::config::{ConfigError, Member};
use crate::per_worker::TableKeys;

impl Admin {
    /// The one path of every change: [`Admin::prepare`] takes every step that can refuse it,
    /// then [`Admin::commit`] puts it in force and cannot fail, so nothing is ever rolled back.
    /// `actor` names who changed the policy, if it changed.
    pub(super) fn apply(
        &self,
        in_force: &mut InForce,
        next: Next,
        actor: &Actor,
    ) -> Result<(), AdminError> {
        let prepared = self.prepare(&next)?;
        self.commit(in_force, next, prepared, actor);
        Ok(())
    }

    /// Validates `next` (static workers, the picker's address rule, aliases and loops, policy),
    /// merges the membership and prepares the router's table. Changes nothing.
    fn prepare(&self, next: &Next) -> Result<Prepared, AdminError> {
        let statics: Vec<WorkerSpec> = next.statics.iter().map(|m| m.spec.clone()).collect();
        validate_membership(&statics)?;
        // A worker added (or a source reloaded) without models into a fleet with models, or
        // the other way round.
        if let Some(error) = next.config.model_problems().into_iter().next() {
            return Err(ConfigError::Invalid { path: None, error }.into());
        }
        // Workers added at run time obey the endpoint picker's `http(s)://IP:PORT` rule too
        // (discovered workers are IP:PORT by construction).
        next.config
            .picker_workers(&next.statics)
            .map_err(|error| ConfigError::Invalid { path: None, error })?;
        // The first problem in list order, an alias before a loop of the same worker.
        let alias = first_alias(&next.statics);
        let checked = alias
            .as_ref()
            .map_or(next.statics.len(), |(index, _)| *index);
        for member in &next.statics[..checked] {
            if let Some(message) = loop_of(member, &self.listeners) {
                return Err(AdminError::Loop(message));
            }
        }
        if let Some((_, message)) = alias {
            return Err(AdminError::Alias(message));
        }
        let policy = next.config.policy_settings();
        policy.validate()?;
        let merged = merge(
            &next.statics,
            &next.config,
            &next.discovered,
            &self.listeners,
        );
        for reason in &merged.skipped {
            tracing::warn!("{reason}");
        }
        let specs: Vec<WorkerSpec> = merged.members.iter().map(|m| m.spec.clone()).collect();
        let table = self
            .router
            .prepare(specs, policy, !next.config.health.wait_for_first_probe)?;
        Ok(Prepared {
            members: Arc::new(merged.members),
            skipped_by_source: merged.skipped_by_source,
            table,
        })
    }

    /// Puts a prepared change in force, in the documented order: the merged membership and the
    /// endpoints first, then the router's table (workers and policy in one swap), then the probe
    /// targets, the settings and the configuration; a policy change is logged and announced.
    fn commit(&self, in_force: &mut InForce, next: Next, prepared: Prepared, actor: &Actor) {
        let Prepared {
            members,
            skipped_by_source,
            table,
        } = prepared;
        in_force.merge_skipped = skipped_by_source;
        let members_changed = *members != *in_force.merged;
        if members_changed {
            // Before the router, like the endpoints: every worker of a table the router publishes
            // has its member (probe and metrics paths) for whoever reads the table first.
            self.members.store(Arc::clone(&members));
        }
        let before = self.router.table();
        let policy = *table.policy();
        // A policy-only change reuses the ring (a new `virtual_nodes` rebuilds it) and needs no
        // endpoints: no new membership generation, no `ring` frame for a threshold change.
        let keeps_workers = table.keeps_workers();
        if !keeps_workers {
            // Endpoints first: every table the router publishes finds its workers' endpoints.
            self.upstreams.publish(&members);
        }
        let after = self.router.commit(table);
        if !keeps_workers {
            // The first request of a new generation would otherwise build its targets.
            self.upstreams.for_table(&after);
            in_force.departed.record(&before, &after);
        }
        if members_changed {
            in_force.merged = members;
            self.probe_now.notify_one();
        }
        if !Arc::ptr_eq(&next.config, &in_force.config) {
            self.settings
                .store(Arc::new(RuntimeSettings::from_config(&next.config)));
            self.config.store(Arc::clone(&next.config));
            let sources = &next.config.discovery;
            let sources_changed = self.sources.send_if_modified(|current| {
                let changed = current != sources;
                if changed {
                    current.clone_from(sources);
                }
                changed
            });
            if sources_changed {
                // Consoles see a removed source go at once, an added one as pending.
                self.publish_discovery();
            }
        }
        in_force.config = next.config;
        in_force.statics = next.statics;
        in_force.discovered = next.discovered;
        // The table's keys only when some worker waits to be removed: a set of every worker's
        // key is whole-fleet work on every change otherwise.
        if !in_force.remove_when_idle.is_empty() {
            let table = self.router.table();
            let members = TableKeys::of(&table);
            in_force
                .remove_when_idle
                .retain(|worker| members.contains(worker));
        }
        let previous = *before.policy();
        if policy != previous {
            log_policy_change(actor, &previous, &policy);
            self.telemetry
                .policy_changed(actor.source, actor.client.clone());
        }
    }
}

/// A change that passed every check: the merged membership and the router's prepared table.
struct Prepared {
    members: Arc<Vec<Member>>,
    /// Discovered workers the merge left out, by source (see `Merged::skipped_by_source`).
    skipped_by_source: HashMap<String, usize>,
    table: PreparedTable,
}

/// The `policy changed` log line: who changed it, and every setting before and after, each its
/// own field (so a JSON log can be queried by setting).
fn log_policy_change(actor: &Actor, before: &PolicySettings, after: &PolicySettings) {
    tracing::info!(
        source = actor.source.as_str(),
        client = actor.client_str(),
        kind = %after.kind,
        min_load_gap = after.min_load_gap,
        max_load_skew = after.max_load_skew,
        spill_order = %after.spill_order,
        virtual_nodes = after.virtual_nodes,
        load_source = after.load_source.as_str(),
        previous_kind = %before.kind,
        previous_min_load_gap = before.min_load_gap,
        previous_max_load_skew = before.max_load_skew,
        previous_spill_order = %before.spill_order,
        previous_load_source = before.load_source.as_str(),
        "policy changed"
    );
}
