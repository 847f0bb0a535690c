//! `GET /ws`: the telemetry websocket. Each connection is the only writer of its socket, so its
//! frames carry a gap-free `seq`; it forwards the aggregator's frames and answers client commands
//! (docs/protocol.md).

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, RawQuery, State};
use axum::response::Response;
use bch_core::policy::PolicyPatch;
use bch_core::telemetry::{
    Ack, ChangeSource, ClientCommand, CommandError, CommandId, ServerMessage, WorkerRecord,
    negotiated_version,
};

use super::handle::ControlPlane;
use super::peer::Peer;
use crate::admin::{Actor, AdminError};
use crate::telemetry::wire::{encode_message, envelope, for_read_only};

/// Largest websocket message a client may send, bytes. Commands are tiny; anything bigger is abuse.
const MAX_CLIENT_MESSAGE: usize = 16 * 1024;

/// `GET /ws`: upgrades to the telemetry websocket. `?v=2` asks for protocol version 2; without it
/// (or with anything unreadable) the client gets version 1, what every older client expects.
/// A connection opened with the metrics token is read-only: its snapshots say so and its write
/// commands are refused.
pub async fn websocket(
    State(plane): State<Arc<ControlPlane>>,
    Peer(peer): Peer,
    RawQuery(query): RawQuery,
    read_only: Option<Extension<ReadOnly>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let client = Client {
        actor: Actor::client(ChangeSource::Ws, peer),
        version: negotiated_version(asked_version(query.as_deref())),
        read_only: read_only.is_some(),
    };
    upgrade
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| serve_client(plane, socket, client))
}

/// Marks a request let in by the metrics token: a `/ws` connection it opens is read-only.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadOnly;

/// Who is on the other end of one connection, and what it may do.
struct Client {
    /// Who its changes are attributed to.
    actor: Actor,
    /// The protocol version spoken.
    version: u32,
    /// Opened with the metrics token: watch only.
    read_only: bool,
}

/// Why a read-only connection's write command changed nothing.
const READ_ONLY: &str = "read-only connection (opened with the metrics token): set_policy, drain and undrain are refused; connect with the admin token to change anything";

/// The version a `/ws` query asks for: the number after `v=`; `None` without one (or when it is
/// not a number: a typo must not cut an old console off).
fn asked_version(query: Option<&str>) -> Option<u32> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("v="))
        .and_then(|v| v.parse().ok())
}

/// One websocket client: the only writer of its socket, so its frames carry a gap-free `seq`.
async fn serve_client(plane: Arc<ControlPlane>, mut socket: WebSocket, client: Client) {
    let version = client.version;
    let (id, mut frames) = plane.telemetry.register(version);
    let mut seq: u64 = 0;
    let shutdown = plane.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = socket.send(Message::Close(Some(CloseFrame { code: 1001, reason: "gateway shutting down".into() }))).await;
                break;
            }
            frame = frames.recv() => {
                let Some(body) = frame else { break };
                let body = if client.read_only { for_read_only(&body) } else { body.as_ref().into() };
                if socket.send(Message::Text(envelope(version, seq, &body).into())).await.is_err() {
                    break;
                }
                seq += 1;
            }
            incoming = socket.recv() => {
                let reply = match incoming {
                    Some(Ok(Message::Text(text))) => handle_command(&plane, id, &client, text.as_str()),
                    Some(Ok(Message::Binary(_))) => Some(command_error(None, "binary messages are not supported; send JSON text")),
                    Some(Ok(Message::Close(_))) | None => break,
                    Some(Ok(_)) => None,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "websocket client sent a malformed frame; closing");
                        break;
                    }
                };
                if let Some(body) = reply {
                    if socket.send(Message::Text(envelope(version, seq, &body).into())).await.is_err() {
                        break;
                    }
                    seq += 1;
                }
            }
        }
    }
    plane.telemetry.unregister(id);
}

fn command_error(id: Option<bch_core::telemetry::CommandId>, message: &str) -> Arc<str> {
    encode_message(&ServerMessage::Error(CommandError {
        id,
        message: message.to_owned(),
    }))
}

/// The answer to a command that changed something: an `ack` with the policy in force (and the
/// worker's record for drain commands), or the `error` that says why nothing changed.
fn answer(
    plane: &ControlPlane,
    id: Option<CommandId>,
    result: Result<Option<WorkerRecord>, AdminError>,
) -> Arc<str> {
    match result {
        Ok(worker) => encode_message(&ServerMessage::Ack(Ack {
            id,
            policy: (*plane.router.table().policy()).into(),
            worker,
        })),
        Err(error) => command_error(id, &error.to_string()),
    }
}

/// Answers one client command: `resync` (no answer; a snapshot follows), `set_policy`, `drain`
/// or `undrain` (an `ack` or an `error` with the same `id`).
fn handle_command(
    plane: &ControlPlane,
    id_of_client: u64,
    client: &Client,
    text: &str,
) -> Option<Arc<str>> {
    let actor = &client.actor;
    let command: ClientCommand = match serde_json::from_str(text) {
        Ok(c) => c,
        Err(e) => {
            // Echo the id back if the message was JSON with one, so the client can match it.
            let id = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| serde_json::from_value(v.get("id")?.clone()).ok());
            return Some(command_error(id, &format!("invalid command: {e}")));
        }
    };
    match command {
        ClientCommand::Resync { .. } => {
            plane.telemetry.resync(id_of_client);
            None
        }
        ClientCommand::SetPolicy { id, .. }
        | ClientCommand::Drain { id, .. }
        | ClientCommand::Undrain { id, .. }
            if client.read_only =>
        {
            Some(command_error(id, READ_ONLY))
        }
        ClientCommand::SetPolicy {
            id,
            kind,
            min_load_gap,
            max_load_skew,
            spill_order,
            load_source,
            admission,
        } => {
            let patch = PolicyPatch {
                kind,
                min_load_gap,
                max_load_skew,
                spill_order,
                virtual_nodes: None,
                load_source,
                admission,
            };
            Some(match plane.admin.set_policy(&patch, actor) {
                Ok(policy) => encode_message(&ServerMessage::Ack(Ack {
                    id,
                    policy: policy.into(),
                    worker: None,
                })),
                Err(error) => command_error(id, &error.to_string()),
            })
        }
        ClientCommand::Drain { id, worker, remove } => {
            let result = plane.admin.drain(&worker, remove, actor).map(Some);
            Some(answer(plane, id, result))
        }
        ClientCommand::Undrain { id, worker } => {
            let result = plane.admin.undrain(&worker, actor).map(Some);
            Some(answer(plane, id, result))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_asked_is_read_leniently() {
        assert_eq!(asked_version(None), None);
        assert_eq!(asked_version(Some("v=2")), Some(2));
        assert_eq!(asked_version(Some("x=1&v=2")), Some(2));
        assert_eq!(asked_version(Some("v=two")), None);
        assert_eq!(negotiated_version(asked_version(Some("v=9"))), 2);
        assert_eq!(negotiated_version(asked_version(Some("v=0"))), 1);
        assert_eq!(negotiated_version(None), 1);
    }
}
