//! A telemetry websocket opened with the metrics token is read-only: its snapshots say
//! `read_only`, every write command on it is refused with an `error` naming why and changes
//! nothing, and it still reads everything and may ask for a resync. The admin token's connection
//! is unchanged.

use crate::common::ws::Client;
use crate::common::*;
use bch_core::telemetry::{ServerMessage, WorkerState};
use serde_json::json;

use super::*;

#[tokio::test]
async fn the_metrics_token_opens_a_read_only_telemetry_connection() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let admin = TempFile::new("admin-token", TOKEN);
    let scraper = TempFile::new("metrics-token", "scrape-only-token\n");
    let mut config = test_config(&[&a, &b]);
    config.server.control_access.admin_token_file = Some(admin.path().to_owned());
    config.server.control_access.metrics_token_file = Some(scraper.path().to_owned());
    let gateway = start(config).await;
    let before = gateway.routing_table().policy().min_load_gap;

    for version in [1, 2] {
        let mut watcher = Client::connect_with_token(&gateway, version, "scrape-only-token").await;
        let ServerMessage::Snapshot(snapshot) = watcher.frame().await.message else {
            panic!("the first frame is a snapshot");
        };
        assert!(snapshot.read_only, "version {version}");
        assert_eq!(snapshot.workers.len(), 2, "it reads everything");

        let writes = [
            json!({"type": "set_policy", "id": 1, "min_load_gap": before + 5}),
            json!({"type": "drain", "id": 2, "worker": "a"}),
            json!({"type": "undrain", "id": 3, "worker": "a"}),
        ];
        for (n, write) in (1..).zip(writes) {
            watcher.send(write).await;
            let refused = watcher.next_error().await;
            assert_eq!(
                refused.id,
                Some(bch_core::telemetry::CommandId::Number(n)),
                "{refused:?}"
            );
            assert!(
                refused.message.contains("read-only") && refused.message.contains("metrics token"),
                "{}",
                refused.message
            );
        }
        assert_eq!(gateway.routing_table().policy().min_load_gap, before);
        assert!(
            gateway
                .routing_table()
                .worker_records(0)
                .iter()
                .all(|w| w.state == WorkerState::Active),
            "nothing drained"
        );
        // A resync is no write: it answers with a snapshot, read-only again.
        watcher.send(json!({"type": "resync"})).await;
        let again = watcher
            .until(|m| match m {
                ServerMessage::Snapshot(s) => Some(s.clone()),
                _ => None,
            })
            .await;
        assert!(again.read_only);
    }

    // The admin token's connection writes, and its snapshot says nothing about read-only.
    let mut operator = Client::connect_with_token(&gateway, 2, TOKEN).await;
    let ServerMessage::Snapshot(snapshot) = operator.frame().await.message else {
        panic!("the first frame is a snapshot");
    };
    assert!(!snapshot.read_only);
    operator
        .send(json!({"type": "set_policy", "id": 9, "min_load_gap": before + 5}))
        .await;
    let ack = operator.next_ack().await;
    assert_eq!(ack.policy.min_load_gap, before + 5);
    gateway.shutdown().await;
}
