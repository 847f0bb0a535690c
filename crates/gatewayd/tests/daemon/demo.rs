//! `gatewayd --demo` teaches what the bounded policy is for: hot keys spill, cold keys stay on
//! their preferred worker, and its traffic starts only once the workers are routable.

use std::collections::BTreeMap;

use bch_core::telemetry::{KeyRecord, ServerMessage};
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use super::*;

/// Every key's latest record, from the telemetry websocket, until `enough` says the window is
/// long enough (bounded: 60 s).
fn key_records(
    control: &str,
    enough: impl Fn(&BTreeMap<String, KeyRecord>) -> bool,
) -> BTreeMap<String, KeyRecord> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{control}/ws"))
            .await
            .expect("websocket upgrade");
        let mut keys = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !enough(&keys) {
            let message = tokio::time::timeout_at(deadline, socket.next())
                .await
                .unwrap_or_else(|_| panic!("the window did not fill in 60 s: {keys:#?}"))
                .expect("socket open")
                .expect("valid frame");
            let Message::Text(text) = message else {
                continue;
            };
            let frame: bch_core::telemetry::ServerFrame = serde_json::from_str(&text).unwrap();
            let records = match frame.message {
                ServerMessage::Snapshot(snapshot) => snapshot.keys,
                ServerMessage::Tick(tick) => tick.keys,
                _ => continue,
            };
            for record in records {
                keys.insert(record.key.clone(), record);
            }
        }
        keys
    })
}

/// Requests and of those served off the preferred worker, summed over the keys starting with
/// `prefix`.
fn totals(keys: &BTreeMap<String, KeyRecord>, prefix: &str) -> (u64, u64) {
    keys.values()
        .filter(|k| k.key.starts_with(prefix))
        .fold((0, 0), |(requests, spills), k| {
            (requests + k.requests_total, spills + k.spills_total)
        })
}

#[test]
fn the_demo_spills_hot_keys_and_keeps_cold_keys_home() {
    let mut command = gatewayd();
    command.args([
        "--demo",
        "--listen",
        "127.0.0.1:0",
        "--control-listen",
        "127.0.0.1:0",
    ]);
    let mut daemon = Daemon::spawn(command);
    let keys = key_records(&daemon.control, |keys| {
        totals(keys, "cold-").0 >= 60 && totals(keys, "hot-").0 >= 60
    });
    let (cold, cold_spills) = totals(&keys, "cold-");
    let (hot, hot_spills) = totals(&keys, "hot-");
    let cold_home = 1.0 - cold_spills as f64 / cold as f64;
    let hot_spilled = hot_spills as f64 / hot as f64;
    eprintln!(
        "cold: {cold} requests, {cold_home:.2} at home; hot: {hot} requests, {hot_spilled:.2} spilled"
    );
    assert!(
        // Before the demo sent cold keys one at a time, each came in bursts of six like the hot
        // ones and only about half of its requests stayed home.
        cold_home >= 0.8,
        "cold keys stay home: {cold_spills} of {cold} spilled: {keys:#?}"
    );
    assert!(
        hot_spilled >= 0.25,
        "hot keys spill: {hot_spills} of {hot} spilled: {keys:#?}"
    );
    // The traffic started once the workers were routable: no request found none.
    let metrics = daemon.get("/metrics");
    let refused = metrics
        .lines()
        .find_map(|l| l.strip_prefix("bch_branch_total{branch=\"no_healthy_workers\"} "))
        .map_or(0.0, |n| n.trim().parse().unwrap());
    assert_eq!(refused, 0.0, "503 no_healthy_workers at the start");
    daemon.signal("TERM");
    assert!(daemon.wait().success());
    // The banner is printed where the traffic starts: after every simulated worker's first
    // probe passed (before, it came out beside the first probes, and so did the first requests).
    let lines = daemon.all_stderr();
    let banner = lines
        .iter()
        .position(|l| l.contains("bch demo: 4 simulated workers"))
        .expect("the banner");
    for worker in ["sim-0", "sim-1", "sim-2", "sim-3"] {
        let probed = lines
            .iter()
            .position(|l| {
                l.contains("passed its first probe") && l.ends_with(&format!("worker={worker}"))
            })
            .unwrap_or_else(|| panic!("{worker} passed its first probe: {lines:#?}"));
        assert!(
            probed < banner,
            "{worker} taken in before the traffic: {lines:#?}"
        );
    }
}
