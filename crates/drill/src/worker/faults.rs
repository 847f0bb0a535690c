//! Faults a worker injects on demand, so tests can watch the gateway handle a crashed or wedged
//! engine: the [`Fault`] kinds, the switch that holds the current one, and how an inference request
//! waits out a stall.

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A fault a worker injects into its answers, switchable at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Healthy: answer normally.
    #[default]
    None,
    /// Every route except `/metrics` answers `500` with an OpenAI error body, as a crashed engine
    /// behind a live HTTP front end does.
    Status500,
    /// Inference routes send nothing at all (no status line, no headers) until the fault is cleared or
    /// the worker shuts down; then they proceed (or answer 503 on shutdown). `/health` still answers:
    /// this is a wedged engine behind a live HTTP server, the case a first-byte timeout exists for.
    StallFirstByte,
}

/// Why an inference request is refused instead of served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// [`Fault::Status500`] is in force.
    EngineDown,
    /// The worker shut down while the request was stalled.
    ShuttingDown,
}

/// The fault in force, shared by the handle (which switches it) and every request (which obeys it).
/// A watch channel, so stalled requests wake up the moment the fault is cleared.
pub(super) struct FaultSwitch(watch::Sender<Fault>);

impl FaultSwitch {
    /// A switch set to [`Fault::None`].
    pub(super) fn new() -> Self {
        Self(watch::Sender::new(Fault::None))
    }

    /// Switches the fault; stalled requests re-check it at once.
    pub(super) fn set(&self, fault: Fault) {
        self.0.send_replace(fault);
    }

    /// The fault in force now.
    pub(super) fn current(&self) -> Fault {
        *self.0.borrow()
    }

    /// Applies the fault to an arriving inference request: `Some` refuses it, `None` lets it
    /// proceed. Under [`Fault::StallFirstByte`] this waits, sending nothing, until the fault changes
    /// or `shutdown` fires.
    pub(super) async fn admit(&self, shutdown: &CancellationToken) -> Option<Refusal> {
        let mut fault = self.0.subscribe();
        loop {
            match *fault.borrow_and_update() {
                Fault::None => return None,
                Fault::Status500 => return Some(Refusal::EngineDown),
                Fault::StallFirstByte => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => return Some(Refusal::ShuttingDown),
                changed = fault.changed() => {
                    // The sender lives in this switch, so this cannot fail while we hold `self`.
                    if changed.is_err() {
                        return None;
                    }
                }
            }
        }
    }
}
