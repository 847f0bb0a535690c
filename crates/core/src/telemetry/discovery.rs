//! The health of DNS discovery sources: the same record in `GET /admin/discovery`, in the
//! telemetry `snapshot` and in a `tick` after a change.

use serde::{Deserialize, Serialize};

/// One DNS discovery source's health, as in `GET /admin/discovery`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoverySource {
    /// The name resolved, as configured (`dns`).
    pub name: String,
    /// The worker source label its workers carry: `dns:NAME`.
    pub source: String,
    /// `srv` (the name begins with `_`) or `address` (A and AAAA records).
    pub kind: super::open::Open<DiscoveryKind>,
    /// What the last resolution gave.
    pub state: super::open::Open<DiscoveryState>,
    /// The most recent error: why a resolution failed or was empty, or one address family's
    /// failed lookup while the other answered (state `ok`). Kept after the source recovered.
    #[serde(default)]
    pub last_error: Option<String>,
    /// When `last_error` happened, milliseconds since the Unix epoch.
    #[serde(default)]
    pub last_error_ms: Option<u64>,
    /// When the last answer with workers came, milliseconds since the Unix epoch; `None` before
    /// the first.
    #[serde(default)]
    pub last_good_ms: Option<u64>,
    /// Age of that answer at the time of the frame (or of the HTTP answer), milliseconds.
    #[serde(default)]
    pub last_good_age_ms: Option<u64>,
    /// Workers of the membership found by this source now (a failing or empty source keeps its
    /// last good set for a while, so this can be above 0 in either state).
    pub workers: u64,
}

impl DiscoverySource {
    /// The record as seen at `now_ms` (milliseconds since the Unix epoch): `last_good_age_ms`
    /// from `last_good_ms`.
    pub fn at(mut self, now_ms: u64) -> DiscoverySource {
        self.last_good_age_ms = self.last_good_ms.map(|good| now_ms.saturating_sub(good));
        self
    }
}

/// How a discovery source reads DNS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscoveryKind {
    /// SRV records: a target and a port per worker.
    Srv,
    /// A and AAAA records: an address per worker, on the entry's port.
    Address,
}

/// What a discovery source's last resolution gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscoveryState {
    /// Started (or restarted by a reload) and not answered yet: at most `timeout_ms`.
    Pending,
    /// The last answer had workers.
    Ok,
    /// The last resolution failed (error code, timeout, no server): the last good set is kept.
    Failing,
    /// The last answer had no usable record (NXDOMAIN, no records, every record skipped).
    Empty,
}

impl DiscoveryKind {
    /// The wire name (`srv`, `address`).
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryKind::Srv => "srv",
            DiscoveryKind::Address => "address",
        }
    }
}

impl std::fmt::Display for DiscoveryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl super::open::Open<DiscoveryState> {
    /// Whether an operator should look: the source fails or answers empty, or is in a state this
    /// build does not know (a newer gateway's), which is shown by name.
    pub fn is_trouble(&self) -> bool {
        self.get().is_none_or(DiscoveryState::is_trouble)
    }
}

impl std::fmt::Display for DiscoveryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DiscoveryState {
    /// The snake-case name used on the wire (`pending`, `ok`, `failing`, `empty`).
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryState::Pending => "pending",
            DiscoveryState::Ok => "ok",
            DiscoveryState::Failing => "failing",
            DiscoveryState::Empty => "empty",
        }
    }

    /// Whether an operator should look: the source fails or answers empty.
    pub fn is_trouble(self) -> bool {
        matches!(self, DiscoveryState::Failing | DiscoveryState::Empty)
    }
}
