//! The connection against a tiny fake gateway on 127.0.0.1:0: connect with the bearer token, take
//! the snapshot, send `set_policy` on an action and see the ack, survive the gateway closing the
//! connection, and show a reconnect countdown once the gateway is gone.

// The handshake callback's error type is tungstenite's HTTP response; its size is not ours to pick.
#![allow(clippy::result_large_err)]

mod common;

use std::time::Duration;

use bch_core::telemetry::{Ack, ClientCommand, ServerFrame, ServerMessage};
use bch_tui::{
    Action, App, CommandState, ConnConfig, ConnEvent, ConnHandle, ConnStatus, ReplicaId, State,
};
use common::{frame, render};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

/// Generous: only reached when something is broken, never part of a passing run's timing.
const WAIT: Duration = Duration::from_secs(10);

/// Applies events from the network task until `done` holds for the state, checking after every
/// single event so short-lived states (a one-off Reconnecting) are not skipped.
async fn pump_until(
    app: &mut App,
    events: &mut mpsc::UnboundedReceiver<ConnEvent>,
    what: &str,
    done: impl Fn(&State) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(app.state()) {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "timed out waiting for: {what}; state: {:?}",
                    app.state().conn()
                )
            })
            .expect("network task ended");
        app.handle_replica_conn(ReplicaId(0), event);
    }
}

fn text(frame: &ServerFrame) -> Message {
    Message::text(serde_json::to_string(frame).unwrap())
}

#[tokio::test]
async fn connect_command_ack_and_reconnect() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<String>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();

    let server = tokio::spawn(async move {
        // First connection: check the token, send the snapshot, answer one set_policy, then close.
        let (tcp, _) = listener.accept().await.unwrap();
        let auth_tx = seen_tx.clone();
        let mut ws =
            tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, resp: Response| {
                let auth = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                auth_tx.send(auth).unwrap();
                Ok(resp)
            })
            .await
            .unwrap();
        ws.send(text(&frame("snapshot"))).await.unwrap();
        let cmd_text = loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Text(t) => break t.to_string(),
                _ => continue,
            }
        };
        seen_tx.send(cmd_text.clone()).unwrap();
        let cmd: ClientCommand = serde_json::from_str(&cmd_text).unwrap();
        let ClientCommand::SetPolicy {
            id, min_load_gap, ..
        } = cmd
        else {
            panic!("expected set_policy, got {cmd_text}");
        };
        let policy = bch_core::policy::PolicySettings {
            min_load_gap: min_load_gap.unwrap(),
            ..Default::default()
        };
        let ack = ServerFrame::new(
            1,
            ServerMessage::Ack(Ack {
                id,
                policy: policy.into(),
                worker: None,
            }),
        );
        ws.send(text(&ack)).await.unwrap();
        ws.close(None).await.unwrap();

        // Second connection (the client's reconnect): a fresh snapshot, then hold it open until
        // the test says to go away, and take the listener down with it.
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        ws.send(text(&frame("snapshot"))).await.unwrap();
        let _ = stop_rx.await;
        drop(ws);
        drop(listener);
    });

    let mut config = ConnConfig::new(url.clone());
    config.token = Some("s3cret".into());
    let handle = ConnHandle::spawn(config);
    let mut events = handle.events;
    let mut app = App::with_replicas(State::for_replicas(vec![url]), vec![handle.commands]);

    pump_until(&mut app, &mut events, "connected with a snapshot", |s| {
        *s.conn() == ConnStatus::Connected && s.live().policy.is_some()
    })
    .await;
    let auth = tokio::time::timeout(WAIT, seen_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(auth, "Bearer s3cret");
    assert_eq!(app.state().live().workers.len(), 4);

    // The operator presses G: set_policy goes out and the change shows as pending.
    assert!(!app.handle_action(Action::GapUp));
    assert_eq!(
        app.state().last_command().unwrap().state,
        CommandState::Pending
    );
    let sent = tokio::time::timeout(WAIT, seen_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let sent: serde_json::Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({"type":"set_policy","id":1,"min_load_gap":3})
    );

    pump_until(&mut app, &mut events, "the ack", |s| {
        s.last_command().unwrap().state == CommandState::Applied
    })
    .await;
    assert_eq!(app.state().live().policy.unwrap().min_load_gap, 3);

    // The gateway closes; the client backs off and reconnects on its own.
    pump_until(&mut app, &mut events, "reconnecting after close", |s| {
        matches!(s.conn(), ConnStatus::Reconnecting { .. })
    })
    .await;
    pump_until(
        &mut app,
        &mut events,
        "reconnected with a fresh snapshot",
        |s| *s.conn() == ConnStatus::Connected && s.last_seq() == Some(0),
    )
    .await;
    assert!(
        !app.state().resyncing(),
        "seq restarts at 0 on a new connection"
    );

    // The gateway goes away for good: the header counts down to the next attempt, and the
    // attempts keep counting up (the backoff was reset by the successful reconnect).
    stop_tx.send(()).unwrap();
    server.await.unwrap();
    pump_until(
        &mut app,
        &mut events,
        "a second failed attempt",
        |s| matches!(s.conn(), ConnStatus::Reconnecting { attempt, .. } if *attempt >= 2),
    )
    .await;
    let ConnStatus::Reconnecting {
        retry_at, reason, ..
    } = app.state().conn().clone()
    else {
        unreachable!()
    };
    assert!(!reason.is_empty());
    let screen = render(app.state(), 80, 24, retry_at - Duration::from_millis(300));
    assert!(screen.contains("RECONNECTING IN 1s"), "{screen}");

    // A change typed while disconnected is answered at once, not queued for later.
    app.handle_action(Action::GapUp);
    pump_until(&mut app, &mut events, "the unsent change to fail", |s| {
        matches!(s.last_command().unwrap().state, CommandState::Failed(_))
    })
    .await;
    assert_eq!(app.state().last_command().unwrap().id, 2);
    drop(app);
    // With the command sender gone the network task ends by itself.
    tokio::time::timeout(WAIT, handle.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_refused_token_is_reported_and_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = tokio_tungstenite::accept_hdr_async(tcp, |_: &Request, _: Response| {
            let mut resp =
                tokio_tungstenite::tungstenite::handshake::server::ErrorResponse::new(None);
            *resp.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::UNAUTHORIZED;
            Err(resp)
        })
        .await;
    });
    let handle = ConnHandle::spawn(ConnConfig::new(url.clone()));
    let mut events = handle.events;
    let mut app = App::with_replicas(State::for_replicas(vec![url]), vec![handle.commands]);
    pump_until(&mut app, &mut events, "reconnecting after 401", |s| {
        matches!(s.conn(), ConnStatus::Reconnecting { .. })
    })
    .await;
    let ConnStatus::Reconnecting {
        reason, attempt, ..
    } = app.state().conn()
    else {
        unreachable!()
    };
    assert_eq!(*attempt, 1);
    assert!(
        reason.contains("401") && reason.contains("--token-file"),
        "{reason}"
    );
}
