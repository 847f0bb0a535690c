//! A read-only console: with `--read-only`, or on a connection the gateway says is read-only
//! (opened with its metrics token), every write key (thresholds, capacity, drain) sends nothing
//! and says why in the status line, while every panel still shows the fleet.

mod common;

use std::time::Duration;

use bch_tui::{Action, ConnConfig, ConnEvent, ConnHandle, Effect, ReplicaId, State};
use common::{frame, render};
use futures_util::SinkExt;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

const WRITES: [Action; 8] = [
    Action::GapDown,
    Action::GapUp,
    Action::SkewDown,
    Action::SkewUp,
    Action::CapDown,
    Action::CapUp,
    Action::Drain,
    Action::Undrain,
];

fn assert_every_write_refused(state: &mut State, why: &str) {
    for action in WRITES {
        assert_eq!(state.apply_action(action), Effect::None, "{action:?}");
        assert!(
            state.notice().is_some_and(|n| n.contains(why)),
            "{action:?}: {:?}",
            state.notice()
        );
    }
    // What only changes the view still works.
    assert_eq!(state.apply_action(Action::TogglePause), Effect::None);
    assert!(state.paused());
}

#[test]
fn the_read_only_flag_refuses_every_write_key() {
    let mut state = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    state.set_read_only();
    state.apply_replica_event(
        ReplicaId(0),
        ConnEvent::Status(bch_tui::ConnStatus::Connected),
    );
    state.apply_replica_frame(ReplicaId(0), frame("snapshot"));
    // Without the flag the same key sends a change.
    let mut fresh = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    fresh.apply_replica_event(
        ReplicaId(0),
        ConnEvent::Status(bch_tui::ConnStatus::Connected),
    );
    fresh.apply_replica_frame(ReplicaId(0), frame("snapshot"));
    assert!(matches!(fresh.apply_action(Action::GapUp), Effect::Send(_)));
    assert_every_write_refused(&mut state, "--read-only");
    let screen = render(&state, 120, 40, Instant::now());
    assert!(screen.contains("READ-ONLY"), "{screen}");
    assert!(screen.contains("w0"), "the fleet is still shown:\n{screen}");
}

/// The gateway's snapshot says the connection is read-only: the console refuses the write keys
/// itself rather than send commands the gateway would refuse.
#[tokio::test]
async fn a_read_only_connection_refuses_every_write_key() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let mut snapshot = serde_json::to_value(frame("snapshot")).unwrap();
        snapshot["read_only"] = true.into();
        ws.send(Message::text(snapshot.to_string())).await.unwrap();
        // Anything the console sent would arrive here; it must send nothing.
        let sent = futures_util::StreamExt::next(&mut ws).await;
        assert!(
            matches!(sent, None | Some(Ok(Message::Close(_)))),
            "the console sent {sent:?}"
        );
    });
    let mut handle = ConnHandle::spawn(ConnConfig::new(url.clone()));
    let mut state = State::for_replicas(vec![url]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while state.last_seq() != Some(0) {
        let event = tokio::time::timeout_at(deadline, handle.events.recv())
            .await
            .expect("a snapshot within 10 s")
            .expect("network task ended");
        state.apply_replica_event(ReplicaId(0), event);
    }
    assert_every_write_refused(&mut state, "metrics token");
    drop(handle.commands);
    drop(handle.events);
    handle.task.await.unwrap();
    server.await.unwrap();
}
