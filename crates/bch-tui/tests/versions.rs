//! The console and the protocol's versions: it asks for version 2, skips message types it does not
//! know without losing its place in the sequence, and follows version 2's membership deltas (a
//! delta that does not add up asks for a snapshot).

// The handshake callback's error type is tungstenite's HTTP response; its size is not ours to pick.
#![allow(clippy::result_large_err)]

mod common;

use std::time::Duration;

use bch_core::telemetry::{
    ClientCommand, MembershipUpdate, PlacedWorker, RingOwnership, ServerFrame, ServerMessage,
};
use bch_tui::{ConnConfig, ConnEvent, ConnHandle, ConnStatus, ReplicaId, State};
use common::{frame, frame_at};
use futures_util::SinkExt;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

const WAIT: Duration = Duration::from_secs(10);

fn text(frame: &ServerFrame) -> Message {
    Message::text(serde_json::to_string(frame).unwrap())
}

/// A newer gateway's message type (here at seq 1) is skipped: no notice, and the tick after it
/// (seq 2) is no gap, so no resync. The console also asks for version 2 on the upgrade.
#[tokio::test]
async fn unknown_message_types_are_skipped_without_a_resync() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let (query_tx, query_rx) = tokio::sync::oneshot::channel::<String>();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws =
            tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, resp: Response| {
                query_tx
                    .send(req.uri().query().unwrap_or("").to_owned())
                    .unwrap();
                Ok(resp)
            })
            .await
            .unwrap();
        ws.send(text(&frame("snapshot"))).await.unwrap();
        ws.send(Message::text(
            r#"{"v":1,"seq":1,"type":"a_frame_from_the_future","whatever":[1,2]}"#,
        ))
        .await
        .unwrap();
        ws.send(text(&frame_at("tick_spill", 2))).await.unwrap();
        // Hold the connection until the test is done.
        std::future::pending::<()>().await;
    });
    let mut handle = ConnHandle::spawn(ConnConfig::new(url));
    let mut state = State::for_replicas(vec!["ws://fake/ws".into()]);
    let mut frames = 0;
    while frames < 3 {
        let event = tokio::time::timeout(WAIT, handle.events.recv())
            .await
            .expect("an event within 10 s")
            .expect("the task runs");
        match &event {
            ConnEvent::Frame(_) => frames += 1,
            ConnEvent::BadFrame(error) => panic!("an unknown type is no bad frame: {error}"),
            _ => {}
        }
        let resync = state.apply_replica_event(ReplicaId(0), event);
        assert_eq!(resync, None, "no gap, so no resync");
    }
    assert_eq!(state.replicas()[0].last_seq(), Some(2));
    assert!(!state.replicas()[0].resyncing());
    assert_eq!(
        query_rx.await.unwrap(),
        "v=2",
        "the console asks for version 2"
    );
    handle.task.abort();
    server.abort();
}

/// A version 2 snapshot without arcs: the console computes the ring from the workers; a delta
/// then edits the list and the ring follows, and a delta that does not add up asks for a
/// snapshot.
#[test]
fn version_2_frames_build_the_ring_and_a_bad_delta_resyncs() {
    let mut snapshot = frame("snapshot");
    snapshot.v = 2;
    let ServerMessage::Snapshot(snap) = &mut snapshot.message else {
        panic!("the fixture is a snapshot");
    };
    snap.ring = None;
    let workers = snap.workers.clone();
    let virtual_nodes = snap.policy.virtual_nodes;
    let mut state = State::for_replicas(vec!["ws://fake/ws".into()]);
    state.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    assert_eq!(state.apply_replica_frame(ReplicaId(0), snapshot), None);
    let ring = state
        .visible()
        .ring
        .clone()
        .expect("computed from the workers");
    assert_eq!(*ring, RingOwnership::of_workers(&workers, virtual_nodes));

    // One worker arrives at the front.
    let mut arrival = workers[0].clone();
    arrival.name = "newcomer".into();
    arrival.url = "http://10.9.9.9:8000".into();
    let mut after = vec![arrival.clone()];
    after.extend(workers.iter().cloned());
    let delta = MembershipUpdate::between(1, &workers, &after, virtual_nodes);
    let frame = |seq, message| ServerFrame { v: 2, seq, message };
    assert_eq!(
        state.apply_replica_frame(ReplicaId(0), frame(1, ServerMessage::Membership(delta))),
        None
    );
    assert_eq!(state.visible().workers[0].name, "newcomer");
    let ring = state.visible().ring.clone().unwrap();
    assert_eq!(*ring, RingOwnership::of_workers(&after, virtual_nodes));

    // A delta claiming more workers than the list then holds: the console missed something.
    let wrong = MembershipUpdate {
        ts_ms: 2,
        virtual_nodes,
        removed: Vec::new(),
        changed: Vec::new(),
        added: vec![PlacedWorker {
            index: 0,
            worker: arrival,
        }],
        worker_count: after.len() + 5,
    };
    assert_eq!(
        state.apply_replica_frame(ReplicaId(0), frame(2, ServerMessage::Membership(wrong))),
        Some(ClientCommand::Resync { id: None })
    );
}
