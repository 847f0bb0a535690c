//! A stand-in for gatewayd's telemetry websocket, for trying the console (and recording screens)
//! before or without a real gateway: `cargo run -p bch-tui --example fake_gateway -- 127.0.0.1:9191`
//! then `cargo run -p bch-tui -- --url ws://127.0.0.1:9191/ws`.
//!
//! It replays the recorded snapshot from `tests/fixtures/`, then sends a tick every 100 ms in which
//! one worker's load swells and ebbs (so the bound markers, the OVER flag and the spill log move),
//! and answers `set_policy` and `resync` the way the protocol says, validating `max_load_skew`
//! like the gateway does. It plays a gateway with admission on (a cap of 8 per worker, a 2 s
//! queue): while w0's demand is over its cap the excess waits in the queue (and, past two waiting,
//! some of it is shed), w0 shows FULL, its spills are capacity spills, and the header's queue row
//! and shed sparkline move; a cap changed from the console applies to the next tick.
#![forbid(unsafe_code)]

use std::time::Duration;

use bch_core::policy::{Branch, PolicyPatch, PolicySettings};
use bch_core::telemetry::{
    Ack, AdmissionSummary, ChangeSource, ClientCommand, CommandError, PolicyUpdate, ServerFrame,
    ServerMessage, ShedRates, SpillEvent, Tick, Totals,
};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

fn snapshot() -> ServerFrame {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture parses")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9191".into());
    let listener = TcpListener::bind(&addr).await?;
    eprintln!("fake gateway telemetry on ws://{addr}/ws");
    loop {
        let (tcp, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Err(e) = serve(tcp).await {
                eprintln!("connection ended: {e}");
            }
        });
    }
}

async fn serve(tcp: tokio::net::TcpStream) -> anyhow::Result<()> {
    let mut ws = tokio_tungstenite::accept_async(tcp).await?;
    let ServerMessage::Snapshot(mut snap) = snapshot().message else {
        anyhow::bail!("fixture is not a snapshot");
    };
    // A gateway with admission on, so the console shows capacities and the queue.
    snap.policy.admission.max_in_flight_per_worker = 8;
    snap.policy.admission.queue_timeout_ms = 2000;
    snap.admission = Some(AdmissionSummary::default());
    let mut policy: PolicySettings = snap
        .policy
        .settings()
        .expect("the fixture names known values");
    let mut admitted_total = 0u64;
    let mut shed_total = 0u64;
    let mut seq = 0u64;
    let mut step = 0u64;
    let mut send = |message: ServerMessage| {
        let frame = ServerFrame::new(seq, message);
        seq += 1;
        Message::text(serde_json::to_string(&frame).expect("frames serialize"))
    };
    ws.send(send(ServerMessage::Snapshot(snap.clone()))).await?;
    let mut interval = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = interval.tick() => {
                step += 1;
                snap.ts_ms += 100;
                // w0 swells to 12 in-flight requests and back over 12 s; the others hum along.
                let phase = (step % 120) as i64;
                let hot = (12 - (phase - 60).abs() / 5).max(0) as u64;
                let demand = [hot, 1 + step % 3, 1 + (step / 3) % 2, 2];
                // Demand over a worker's cap waits at the gateway instead of reaching it.
                let cap = policy.admission.max_in_flight_per_worker;
                let capped = |d: u64| if cap == 0 { d } else { d.min(cap) };
                let loads = demand.map(capped);
                let waiting_now: u64 = demand.iter().map(|d| d - capped(*d)).sum();
                let mut workers = snap.workers.clone();
                for (w, load) in workers.iter_mut().zip(loads) {
                    w.active = load;
                    w.load = Some(load);
                    w.requests_total += load;
                    w.capacity = (cap > 0).then_some(cap);
                    w.full = cap > 0 && load >= cap;
                }
                let hot = loads[0];
                let healthy: Vec<u64> = loads.to_vec();
                let min = *healthy.iter().min().unwrap_or(&0);
                let mean = healthy.iter().sum::<u64>() as f64 / healthy.len() as f64;
                let over = hot.saturating_sub(min) > policy.min_load_gap
                    && hot as f64 > mean * policy.max_load_skew;
                let hot_full = workers[0].full;
                let spills = if over || hot_full {
                    vec![SpillEvent {
                        ts_ms: snap.ts_ms,
                        key: "chat-session-0001".into(),
                        branch: if hot_full {
                            Branch::ExplicitRoutingKeyCapacitySpill.into()
                        } else {
                            Branch::ExplicitRoutingKeySpillover.into()
                        },
                        from: "w0".into(),
                        to: "w1".into(),
                        preferred_load: hot,
                        min_load: min,
                        mean_load: mean,
                        min_load_gap: policy.min_load_gap,
                        max_load_skew: policy.max_load_skew,
                        load_signal: Default::default(),
                        cause: Default::default(),
                    }]
                } else {
                    vec![]
                };
                // Without a queue the excess is shed at once; with one, what waits beyond two
                // requests times out now and then.
                let (waiting, shed_rates) = if policy.admission.queue_timeout_ms == 0 {
                    (0, ShedRates { no_queue: waiting_now as f64 * 5.0, ..ShedRates::default() })
                } else {
                    let timeouts = waiting_now.saturating_sub(2) as f64 * 3.0;
                    (waiting_now, ShedRates { queue_timeout: timeouts, ..ShedRates::default() })
                };
                let shed_per_s = shed_rates.no_queue + shed_rates.queue_timeout;
                let admitted_per_s = 40.0 + hot as f64 * 6.0;
                admitted_total += (admitted_per_s / 10.0) as u64;
                shed_total += (shed_per_s / 10.0).round() as u64;
                let admission = AdmissionSummary {
                    waiting,
                    admitted_per_s,
                    shed_per_s,
                    shed_per_s_by_reason: shed_rates,
                    admitted_total,
                    shed_total,
                };
                snap.admission = Some(admission);
                let tick = Tick {
                    ts_ms: snap.ts_ms,
                    workers,
                    keys: vec![],
                    removed_keys: vec![],
                    totals: Totals {
                        requests_per_s: 40.0 + hot as f64 * 6.0,
                        spills_per_s: spills.len() as f64 * 10.0,
                        requests_total: 2751 + step * 5,
                        spills_total: 7 + step / 10,
                    },
                    spills,
                    dropped_events: 0,
                    discovery: None,
                    admission: Some(admission),
                };
                ws.send(send(ServerMessage::Tick(tick))).await?;
            }
            msg = ws.next() => {
                let Some(msg) = msg else { return Ok(()) };
                let Message::Text(text) = msg? else { continue };
                match serde_json::from_str::<ClientCommand>(&text) {
                    Ok(ClientCommand::SetPolicy { id, kind, min_load_gap, max_load_skew, spill_order, load_source, admission }) => {
                        let patch = PolicyPatch { kind, min_load_gap, max_load_skew, spill_order, virtual_nodes: None, load_source, admission };
                        match policy.patched(&patch) {
                            Ok(next) => {
                                policy = next;
                                snap.policy = next.into();
                                ws.send(send(ServerMessage::Ack(Ack { id, policy: policy.into(), worker: None }))).await?;
                                let update = PolicyUpdate { ts_ms: snap.ts_ms, policy: policy.into(), changed_by: ChangeSource::Ws.into(), client: None };
                                ws.send(send(ServerMessage::Policy(update))).await?;
                            }
                            Err(e) => {
                                let err = CommandError { id, message: e.to_string() };
                                ws.send(send(ServerMessage::Error(err))).await?;
                            }
                        }
                    }
                    Ok(ClientCommand::Resync { .. }) => {
                        ws.send(send(ServerMessage::Snapshot(snap.clone()))).await?;
                    }
                    Ok(ClientCommand::Drain { id, worker, .. } | ClientCommand::Undrain { id, worker }) => {
                        // Recorded telemetry has no live workers to drain.
                        let err = CommandError { id, message: format!("the fake gateway cannot drain {worker}") };
                        ws.send(send(ServerMessage::Error(err))).await?;
                    }
                    Err(e) => {
                        let err = CommandError { id: None, message: format!("bad command: {e}") };
                        ws.send(send(ServerMessage::Error(err))).await?;
                    }
                }
            }
        }
    }
}
