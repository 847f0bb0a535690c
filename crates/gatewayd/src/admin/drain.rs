//! Draining: a worker that takes no new requests while its in-flight ones finish, listed with its
//! in-flight count and state `draining`, and, when asked, removed from the membership once idle
//! (the drain watcher in `crate::drain_watch` notices that and calls [`Admin::finish_drain`]).

use bch_core::telemetry::{WorkerRecord, WorkerState};

use super::{Actor, Admin, AdminError};
use crate::per_worker::WorkerKey;

impl Admin {
    /// Stops routing new requests to the worker called `name` (it stays a member, listed with its
    /// in-flight count and state `draining`); with `remove_when_idle` it leaves the membership
    /// once its last request ended. Draining a draining worker updates `remove_when_idle`. A
    /// removal is refused up front for a worker DNS discovery has: it would come back.
    pub fn drain(
        &self,
        name: &str,
        remove_when_idle: bool,
        actor: &Actor,
    ) -> Result<WorkerRecord, AdminError> {
        let mut in_force = self.lock();
        if remove_when_idle {
            Self::removable(&in_force, name)?;
        }
        let changed = self
            .router
            .set_state(name, WorkerState::Draining)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))?;
        let key = self.key_of(name)?;
        if remove_when_idle {
            in_force.remove_when_idle.insert(key);
        } else {
            in_force.remove_when_idle.remove(&key);
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
        in_force.remove_when_idle.remove(&self.key_of(name)?);
        drop(in_force);
        if changed {
            tracing::info!(worker = %name, source = actor.source.as_str(), client = actor.client_str(), "worker undrained: takes new requests again");
        }
        self.record(name)
    }

    /// Called when the draining `worker` was seen idle: removes it if its drain asked for that.
    /// `None` when it is no longer a draining member with nothing in flight (undrained, removed,
    /// or busy after all); else whether it was removed.
    pub fn finish_drain(&self, worker: &WorkerKey) -> Option<bool> {
        let mut in_force = self.lock();
        let table = self.router.table();
        let index = worker.index_in(&table)?;
        let idle = table.workers()[index].stats.active() == 0;
        if table.states()[index] != WorkerState::Draining || !idle {
            return None;
        }
        if !in_force.remove_when_idle.remove(worker) {
            return Some(false);
        }
        let name = &table.workers()[index].spec.name;
        let actor = Actor::drain();
        match self.remove_static(&mut in_force, name, &actor) {
            Ok(_) => {
                tracing::info!(worker = %name, source = actor.source.as_str(), "worker removed");
                Some(true)
            }
            Err(error) => {
                tracing::warn!(worker = %name, %error, "drained worker could not be removed");
                Some(false)
            }
        }
    }

    /// The key of the member called `name`.
    fn key_of(&self, name: &str) -> Result<WorkerKey, AdminError> {
        let table = self.router.table();
        let index = table
            .index_of(name)
            .ok_or_else(|| AdminError::UnknownWorker(name.to_owned()))?;
        Ok(WorkerKey::of(&table.workers()[index].spec))
    }
}
