//! Names from closed sets as the wire carries them: a spill branch, a key kind, a worker state, a
//! policy kind, a load signal. A newer gateway may send a name this build does not know; a
//! consumer keeps reading the frame and shows the name as text ([`Open::Unknown`]) instead of
//! refusing the whole frame. The gateway always sends known names, so its JSON is the same as
//! the plain enum's.

use std::fmt;

use serde::de::IntoDeserializer;
use serde::de::value::{Error as ValueError, StrDeserializer};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::admission::AdmissionSettings;
use crate::fleet_load::LoadSource;
use crate::policy::{PolicyKind, PolicySettings, SpillOrder};

/// A value of `T` (an enum whose wire form is a name), or the name a newer gateway sent that this
/// build does not know. Serialised as the name either way.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Open<T> {
    /// A name this build knows.
    Known(T),
    /// A name this build does not know, as sent (a newer gateway's).
    Unknown(String),
}

impl<T> Open<T> {
    /// The known value; `None` for a name this build does not know.
    pub fn known(&self) -> Option<&T> {
        match self {
            Open::Known(value) => Some(value),
            Open::Unknown(_) => None,
        }
    }
}

impl<T: Copy> Open<T> {
    /// The known value, copied; `None` for a name this build does not know.
    pub fn get(&self) -> Option<T> {
        self.known().copied()
    }
}

impl<T> From<T> for Open<T> {
    fn from(value: T) -> Self {
        Open::Known(value)
    }
}

impl<T: Default> Default for Open<T> {
    fn default() -> Self {
        Open::Known(T::default())
    }
}

impl<T: PartialEq> PartialEq<T> for Open<T> {
    fn eq(&self, other: &T) -> bool {
        self.known() == Some(other)
    }
}

impl<T: fmt::Display> fmt::Display for Open<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Open::Known(value) => value.fmt(f),
            Open::Unknown(name) => f.write_str(name),
        }
    }
}

impl<T: Serialize> Serialize for Open<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Open::Known(value) => value.serialize(serializer),
            Open::Unknown(name) => serializer.serialize_str(name),
        }
    }
}

impl<'de, T: for<'a> Deserialize<'a>> Deserialize<'de> for Open<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        let known: StrDeserializer<'_, ValueError> = name.as_str().into_deserializer();
        Ok(match T::deserialize(known) {
            Ok(value) => Open::Known(value),
            Err(_) => Open::Unknown(name),
        })
    }
}

/// The policy as telemetry frames carry it: [`PolicySettings`]' fields, with the kind, spill
/// order and load source [`Open`], so a console reads a newer gateway's policy (a kind it does not
/// know) and shows the name. The JSON is [`PolicySettings`]' exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// Which policy decides.
    pub kind: Open<PolicyKind>,
    /// `min_load_gap`, requests.
    pub min_load_gap: u64,
    /// `max_load_skew`, a factor ≥ 1.0.
    pub max_load_skew: f64,
    /// Where a spilled request goes.
    #[serde(default)]
    pub spill_order: Open<SpillOrder>,
    /// Points per worker on the ring.
    pub virtual_nodes: u32,
    /// Which per-worker load the rule reads.
    #[serde(default)]
    pub load_source: Open<LoadSource>,
    /// Capacity, saturation and queue settings.
    #[serde(default)]
    pub admission: AdmissionSettings,
}

impl PolicyRecord {
    /// The settings, when this build knows every name in them; `None` when the kind, spill order
    /// or load source is a newer gateway's.
    pub fn settings(&self) -> Option<PolicySettings> {
        Some(PolicySettings {
            kind: self.kind.get()?,
            min_load_gap: self.min_load_gap,
            max_load_skew: self.max_load_skew,
            spill_order: self.spill_order.get()?,
            virtual_nodes: self.virtual_nodes,
            load_source: self.load_source.get()?,
            admission: self.admission,
        })
    }

    /// The names this build does not know, as `field name` pairs (`kind prefix_aware`).
    pub fn unknown_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        if let Open::Unknown(name) = &self.kind {
            names.push(format!("kind {name}"));
        }
        if let Open::Unknown(name) = &self.spill_order {
            names.push(format!("spill_order {name}"));
        }
        if let Open::Unknown(name) = &self.load_source {
            names.push(format!("load_source {name}"));
        }
        names
    }
}

impl From<PolicySettings> for PolicyRecord {
    fn from(p: PolicySettings) -> Self {
        Self {
            kind: p.kind.into(),
            min_load_gap: p.min_load_gap,
            max_load_skew: p.max_load_skew,
            spill_order: p.spill_order.into(),
            virtual_nodes: p.virtual_nodes,
            load_source: p.load_source.into(),
            admission: p.admission,
        }
    }
}

impl Default for PolicyRecord {
    fn default() -> Self {
        PolicySettings::default().into()
    }
}

impl PartialEq<PolicySettings> for PolicyRecord {
    fn eq(&self, other: &PolicySettings) -> bool {
        self.settings().as_ref() == Some(other)
    }
}
