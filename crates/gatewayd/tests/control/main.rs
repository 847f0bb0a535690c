//! Control plane integration tests: the admin API, bearer-token auth, reload, explain, metrics and
//! health probes, against a real gateway and real fake workers on loopback (docs/api.md); also the
//! control plane against a browser, worker drains and the telemetry websocket.

#[path = "../common/mod.rs"]
mod common;

/// Polls `$cond` (an expression reading the API, may `.await`) until it holds; panics after a
/// bounded deadline. Defined before the modules so that they can use it.
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if $cond {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {}",
                $what
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }};
}

mod auth;
mod browser_guard;
mod drain;
mod explain;
mod membership_changes;
mod metrics;
mod models;
mod policy;
mod probes;
mod read_only;
mod reload;
mod replay;
mod telemetry;
mod telemetry_versions;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use gatewayd::RunningGateway;
use serde_json::Value;

const ROUTING_KEY: &str = "x-smg-routing-key";
const TARGET: &str = "x-smg-target-worker";
const TOKEN: &str = "s3cret-token-for-tests";

/// A file in the temp dir with a unique name, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, contents: &str) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = std::env::temp_dir().join(format!(
            "bch-control-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    fn write(&self, contents: &str) {
        std::fs::write(&self.0, contents).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn control(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.control_addr)
}

fn data(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.data_addr)
}

async fn get_json(url: &str) -> Value {
    let response = client().get(url).send().await.unwrap();
    assert_eq!(response.status(), 200, "GET {url}");
    response.json().await.unwrap()
}

async fn policy(gateway: &RunningGateway) -> Value {
    get_json(&control(gateway, "/admin/policy")).await
}

async fn workers(gateway: &RunningGateway) -> Vec<Value> {
    get_json(&control(gateway, "/admin/workers")).await["workers"]
        .as_array()
        .unwrap()
        .clone()
}

async fn worker_names(gateway: &RunningGateway) -> Vec<String> {
    workers(gateway)
        .await
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn healthy(gateway: &RunningGateway, name: &str) -> bool {
    workers(gateway)
        .await
        .iter()
        .find(|w| w["name"] == name)
        .unwrap_or_else(|| panic!("no worker {name}"))["healthy"]
        .as_bool()
        .unwrap()
}

/// Asserts the OpenAI error shape and returns the message.
fn error_message(body: &Value) -> String {
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error["code"].is_string(), "{body}");
    error["message"].as_str().unwrap().to_owned()
}

/// The value of the first sample of `name` whose labels contain `labels`.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            let series_name = series.split('{').next().unwrap();
            series_name == name && series.contains(labels)
        })
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

async fn scrape(gateway: &RunningGateway) -> String {
    let response = client()
        .get(control(gateway, "/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}
