//! What one warning is: its [`Severity`] and its sentence, and the drain time that makes one (the
//! rules that find them are in `warnings.rs`).

use tokio::time::Duration;

/// How long a worker may drain before it is reported, unless `--drain-warning` says otherwise:
/// a drain that long usually waits on a stuck stream.
pub const DRAIN_WARNING_DEFAULT: Duration = Duration::from_secs(5 * 60);

/// How serious a warning is; the header shows the most serious one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Something routes worse than it should (a stale scrape, a long drain, a surge).
    Warning,
    /// Something is down or refuses work (a replica, a worker failing its probes, a shed).
    Alert,
}

/// One problem, said in one sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// How serious it is.
    pub severity: Severity,
    /// What is wrong and why, e.g. `worker w2 fails its health probes: refused`. Names and
    /// reasons are as the gateway sent them: the view makes them printable.
    pub sentence: String,
}

impl Warning {
    /// An alert: something is down or refuses work.
    pub(crate) fn alert(sentence: String) -> Self {
        Self {
            severity: Severity::Alert,
            sentence,
        }
    }

    /// A warning: something routes worse than it should.
    pub(crate) fn notice(sentence: String) -> Self {
        Self {
            severity: Severity::Warning,
            sentence,
        }
    }
}
