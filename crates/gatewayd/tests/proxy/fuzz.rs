//! Fuzzing on the stable toolchain (docs/reliability.md): proptest over arbitrary bytes and structure-aware
//! generators for configuration parsing, routing-key extraction, header handling, worker URLs and
//! telemetry/admin command parsing — in-process and against a live gateway on loopback.
//!
//! Every input must end in a value or a clear error: no panic, no 5xx from the gateway, no change
//! to the load accounting. Case counts are modest by default (the file runs in seconds in debug);
//! `BCH_LONG_DRILLS=1` multiplies them by 20. Failing inputs are shrunk and saved by proptest under
//! `proptest-regressions/`.

use crate::common;
use crate::common::raw;

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use bch_core::policy::{PolicyPatch, PolicySettings};
use bch_core::routing_key::{self, MAX_EXPLICIT_KEY_BYTES, RoutingHeaders, RoutingKey};
use bch_core::telemetry::ClientCommand;
use gatewayd::config::{Config, WorkerUrl, WorkerUrlError};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

/// Cases per property: `base`, or 20× with `BCH_LONG_DRILLS=1`.
fn cases(base: u32) -> u32 {
    let long = std::env::var_os("BCH_LONG_DRILLS").is_some_and(|v| !v.is_empty() && v != "0");
    if long { base * 20 } else { base }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration

/// A structure-aware TOML document: known sections and fields (plus unknown ones) with values of
/// every type, in range and out.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0u64..100_000).prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
        Just("1.0".to_owned()),
        Just("0".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        "[a-z0-9:/._#\\- ]{0,40}".prop_map(|s| format!("{s:?}")),
        Just("\"http://127.0.0.1:8001\"".to_owned()),
        Just("\"127.0.0.1:0\"".to_owned()),
        Just("\"bounded_consistent_hashing\"".to_owned()),
        Just("[]".to_owned()),
        Just("[\"http://console.example:3000\", \"\"]".to_owned()),
        Just("{}".to_owned()),
        "\\PC{0,12}".prop_map(|s| format!("{s:?}")),
    ]
}

const SECTIONS: &[(&str, &[&str])] = &[
    (
        "server",
        &[
            "listen",
            "control_listen",
            "admin_token_file",
            "max_body_bytes",
            "max_connections",
            "header_read_timeout_ms",
            "connect_timeout_ms",
            "first_byte_timeout_ms",
            "stream_idle_timeout_ms",
            "shutdown_grace_ms",
            "request_body_timeout_ms",
            "client_stall_timeout_ms",
            "upstream_idle_timeout_ms",
            "control_allowed_hosts",
            "control_allowed_origins",
        ],
    ),
    ("routing", &["routing_key_header", "target_worker_header"]),
    (
        "policy",
        &["kind", "min_load_gap", "max_load_skew", "virtual_nodes"],
    ),
    (
        "health",
        &[
            "path",
            "interval_ms",
            "timeout_ms",
            "unhealthy_threshold",
            "healthy_threshold",
            "passive",
        ],
    ),
    (
        "telemetry",
        &[
            "interval_ms",
            "max_keys",
            "redact_keys",
            "max_spill_events",
            "client_queue",
        ],
    ),
    ("log", &["format", "level"]),
    ("[workers]", &["name", "url", "ring_id", "health_path"]),
    ("nonsense", &["x"]),
];

fn toml_document() -> impl Strategy<Value = String> {
    let section = (0..SECTIONS.len()).prop_flat_map(|s| {
        let (name, fields) = SECTIONS[s];
        let field = prop_oneof![
            4 => (0..fields.len()).prop_map(move |f| fields[f].to_owned()),
            1 => "[a-z_]{1,12}".prop_map(|s| s),
        ];
        proptest::collection::vec((field, toml_value()), 0..6).prop_map(move |pairs| {
            let mut text = format!("[{name}]\n");
            for (k, v) in pairs {
                text.push_str(&format!("{k} = {v}\n"));
            }
            text
        })
    });
    proptest::collection::vec(section, 0..6).prop_map(|sections| sections.concat())
}

fn temp_path(tag: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("bch-fuzz-{}-{tag}-{n}.toml", std::process::id()))
}

/// Loads `text` through the real file path; on success the configuration is usable as a whole.
fn check_config_text(text: &str) {
    let path = temp_path("config");
    std::fs::write(&path, text).unwrap();
    let loaded = Config::load(&path);
    let _ = std::fs::remove_file(&path);
    match loaded {
        Ok(config) => {
            config.validate().expect("a loaded config validates");
            config.members().expect("a loaded config has valid members");
            for worker in &config.workers {
                WorkerUrl::parse(&worker.url).expect("loaded URLs parse");
            }
        }
        Err(error) => {
            let message = error.to_string();
            assert!(message.starts_with("invalid config"), "{message}");
            assert!(message.contains(&*path.to_string_lossy()), "{message}");
            assert!(message.len() > 20, "{message}");
        }
    }
}

proptest! {
    #![proptest_config(config(cases(256)))]

    #[test]
    fn config_from_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(config) = toml::from_str::<Config>(&text)
            && let Err(e) = config.validate() {
                prop_assert!(!e.to_string().is_empty());
            }
    }

    #[test]
    fn config_from_structured_documents(text in toml_document()) {
        check_config_text(&text);
    }

    #[test]
    fn worker_urls_parse_or_explain(url in prop_oneof![
        "\\PC{0,40}",
        "(http|https|ftp|)://[a-z0-9.:\\[\\]@%]{0,20}(/[a-z0-9%?#.]{0,10}){0,3}",
    ], path in "/[a-zA-Z0-9/%._~-]{0,30}") {
        match WorkerUrl::parse(&url) {
            Ok(parsed) => {
                let pq = path.parse().unwrap();
                let _ = parsed.join(Some(&pq));
            }
            // Credentials are the one thing an error never quotes: the URL appears with them
            // replaced by `***`.
            Err(WorkerUrlError::Credentials(redacted)) => {
                let start = url.find("//").map_or(0, |i| i + 2);
                prop_assert!(redacted[start..].starts_with("***@"), "{}", redacted);
                prop_assert!(url.ends_with(&redacted[start + 3..]), "{}", redacted);
            }
            Err(error) => prop_assert!(error.to_string().contains(&format!("{url:?}")), "{}", error),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Routing keys and headers

const HEADER_NAMES: [&str; 8] = [
    "x-smg-routing-key",
    "x-smg-target-worker",
    "authorization",
    "x-forwarded-for",
    "cookie",
    "connection",
    "keep-alive",
    "x-other",
];

fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        "[ -~]{0,140}".prop_map(String::into_bytes),
        Just(Vec::new()),
        Just(vec![b'k'; MAX_EXPLICIT_KEY_BYTES]),
        Just(vec![b'k'; MAX_EXPLICIT_KEY_BYTES + 1]),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    proptest::collection::vec(
        (
            prop_oneof![
                4 => (0..HEADER_NAMES.len()).prop_map(|i| HEADER_NAMES[i].to_owned()),
                1 => "[a-z-]{1,10}",
            ],
            header_bytes(),
        ),
        0..8,
    )
}

proptest! {
    #![proptest_config(config(cases(512)))]

    #[test]
    fn routing_key_extraction_follows_precedence(pairs in headers()) {
        let names = RoutingHeaders::default();
        let first = |name: &str| pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
        let extracted = routing_key::extract(&names, first);
        let target = first("x-smg-target-worker").filter(|v| !v.is_empty());
        let explicit = first("x-smg-routing-key");
        // The key grammar: non-empty UTF-8 of at most 128 bytes, no control character, no
        // space at either end.
        let valid_explicit = explicit.filter(|v| {
            !v.is_empty()
                && v.len() <= MAX_EXPLICIT_KEY_BYTES
                && std::str::from_utf8(v).is_ok_and(|text| {
                    !text.chars().any(char::is_control)
                        && !text.starts_with(' ')
                        && !text.ends_with(' ')
                })
        });
        match extracted.key {
            RoutingKey::Target(raw) => prop_assert_eq!(Some(raw), target),
            RoutingKey::Explicit(key) => {
                prop_assert!(target.is_none());
                prop_assert_eq!(Some(key.as_str().as_bytes()), valid_explicit);
            }
            RoutingKey::Implicit(_) => {
                prop_assert!(target.is_none() && valid_explicit.is_none());
                prop_assert!(["authorization", "x-forwarded-for", "cookie"]
                    .iter()
                    .any(|h| first(h).is_some_and(|v| !v.is_empty())));
            }
            RoutingKey::None => {
                prop_assert!(target.is_none() && valid_explicit.is_none());
                prop_assert!(["authorization", "x-forwarded-for", "cookie"]
                    .iter()
                    .all(|h| first(h).is_none_or(<[u8]>::is_empty)));
            }
        }
        // An explicit header is reported as ignored exactly when present, unusable and not
        // overridden by a target.
        if target.is_none() {
            prop_assert_eq!(
                extracted.ignored_explicit.is_some(),
                explicit.is_some() && valid_explicit.is_none()
            );
        }
    }

    #[test]
    fn hop_by_hop_stripping_handles_any_header_map(pairs in headers(), connection in header_bytes()) {
        let mut map = HeaderMap::new();
        for (name, value) in &pairs {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value)) {
                map.append(n, v);
            }
        }
        let named: Vec<String> = if let Ok(v) = HeaderValue::from_bytes(&connection) {
            map.append(http::header::CONNECTION, v.clone());
            v.to_str().map(|s| s.split(',').map(|t| t.trim().to_ascii_lowercase()).collect()).unwrap_or_default()
        } else {
            Vec::new()
        };
        gatewayd::testing::strip_hop_by_hop(&mut map);
        for hop in ["connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authorization"] {
            prop_assert!(!map.contains_key(hop));
        }
        for name in named.iter().filter(|n| HeaderName::from_bytes(n.as_bytes()).is_ok()) {
            prop_assert!(!map.contains_key(name.as_str()), "{} named in Connection survived", name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Telemetry commands and policy patches

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "\\PC{0,20}".prop_map(serde_json::Value::from),
        Just(serde_json::Value::from("set_policy")),
        Just(serde_json::Value::from("resync")),
        Just(serde_json::Value::from("bounded_consistent_hashing")),
    ];
    leaf.prop_recursive(2, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("type".to_owned()),
                    Just("id".to_owned()),
                    Just("kind".to_owned()),
                    Just("min_load_gap".to_owned()),
                    Just("max_load_skew".to_owned()),
                    Just("virtual_nodes".to_owned()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A command-shaped object: right type tag, fields of any type.
fn command_json() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("set_policy"), Just("resync"), Just("bogus")],
        proptest::collection::btree_map(
            prop_oneof![
                Just("id"),
                Just("kind"),
                Just("min_load_gap"),
                Just("max_load_skew"),
                Just("extra")
            ],
            json_value(),
            0..4,
        ),
    )
        .prop_map(|(kind, fields)| {
            let mut object = serde_json::Map::new();
            object.insert("type".into(), kind.into());
            for (k, v) in fields {
                object.insert(k.to_owned(), v);
            }
            serde_json::Value::Object(object).to_string()
        })
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        command_json(),
        json_value().prop_map(|v| v.to_string()),
        proptest::collection::vec(any::<u8>(), 0..200)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

proptest! {
    #![proptest_config(config(cases(512)))]

    #[test]
    fn telemetry_commands_parse_or_refuse(text in any_text()) {
        if let Ok(ClientCommand::SetPolicy { kind, min_load_gap, max_load_skew, spill_order, load_source, admission, .. }) =
            serde_json::from_str::<ClientCommand>(&text)
        {
            let patch = PolicyPatch { kind, min_load_gap, max_load_skew, spill_order, virtual_nodes: None, load_source, admission };
            match PolicySettings::default().patched(&patch) {
                Ok(p) => prop_assert!(p.max_load_skew.is_finite() && p.max_load_skew >= 1.0),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Against a live gateway

struct Live {
    runtime: tokio::runtime::Runtime,
    data: SocketAddr,
    control: SocketAddr,
    gateway: gatewayd::RunningGateway,
}

/// One gateway (and two fake workers) for the whole binary, on its own runtime.
fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (data, control, gateway) = runtime.block_on(async {
            let a = common::fake_worker("a").await;
            let b = common::fake_worker("b").await;
            let mut config = common::test_config(&[&a, &b]);
            config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
            let running = common::start(config).await;
            // The workers and the gateway live as long as the runtime (the test binary).
            std::mem::forget(a);
            std::mem::forget(b);
            (running.data_addr, running.control_addr, running)
        });
        Live {
            runtime,
            data,
            control,
            gateway,
        }
    })
}

fn assert_idle(live: &Live) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let table = live.gateway.routing_table();
        if table.workers().iter().all(|w| w.stats.active() == 0) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "load left behind");
        std::thread::sleep(Duration::from_millis(2));
    }
}

proptest! {
    #![proptest_config(config(cases(48)))]

    /// Arbitrary header names and values (raw bytes, whatever HTTP allows on the wire and more):
    /// the data plane answers every request with a status, never a 5xx of its own except the
    /// documented 503 for an unknown target worker.
    #[test]
    fn live_data_plane_headers(pairs in headers(), path in "/[a-zA-Z0-9/%._~-]{0,20}") {
        let live = live();
        let mut request = format!("POST {path} HTTP/1.1\r\nhost: fuzz\r\nconnection: close\r\ncontent-length: 2\r\n").into_bytes();
        for (name, value) in &pairs {
            let value: Vec<u8> = value.iter().copied().filter(|b| *b != b'\r' && *b != b'\n').collect();
            request.extend_from_slice(name.as_bytes());
            request.extend_from_slice(b": ");
            request.extend_from_slice(&value);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n{}");
        let status = raw::exchange_blocking(live.data, &request).status;
        let status = status.expect("an HTTP answer");
        prop_assert!(
            status == 200 || status == 400 || status == 431 || status == 503,
            "status {}", status
        );
        assert_idle(live);
    }

    /// Arbitrary bodies to `PUT /admin/policy` and arbitrary explain queries: 200 or 400, and the
    /// policy in force is always valid.
    #[test]
    fn live_admin_inputs(body in any_text(), query in "[a-z_=&%0-9A-F+.-]{0,40}") {
        let live = live();
        let request = format!(
            "PUT /admin/policy HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            live.control,
            body.len()
        );
        let status = raw::exchange_blocking(live.control, request.as_bytes()).status.expect("an answer");
        prop_assert!(status == 200 || status == 400 || status == 422, "PUT status {}", status);
        let request = format!("GET /admin/explain?{query} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n", live.control);
        let status = raw::exchange_blocking(live.control, request.as_bytes()).status.expect("an answer");
        prop_assert!(status == 200 || status == 400, "explain status {}", status);
        let policy = *live.gateway.routing_table().policy();
        prop_assert!(policy.max_load_skew.is_finite() && policy.max_load_skew >= 1.0);
    }

    /// Arbitrary websocket commands: each gets an `ack` or an `error` (or nothing, for `resync`),
    /// and the connection stays usable.
    #[test]
    fn live_websocket_commands(texts in proptest::collection::vec(any_text(), 1..6)) {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let live = live();
        live.runtime.block_on(async {
            let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", live.control))
                .await
                .unwrap();
            for text in &texts {
                ws.send(Message::Text(text.clone().into())).await.unwrap();
            }
            // A final well-formed command proves the connection is still served in order.
            ws.send(Message::Text(r#"{"type":"set_policy","id":"probe"}"#.into())).await.unwrap();
            loop {
                let message = tokio::time::timeout(Duration::from_secs(5), ws.next())
                    .await
                    .expect("a frame in time")
                    .expect("socket open")
                    .expect("valid frame");
                let Message::Text(frame) = message else { continue };
                let v: serde_json::Value = serde_json::from_str(&frame).unwrap();
                if v["type"] == "ack" && v["id"] == "probe" {
                    break;
                }
            }
        });
        let policy = *live.gateway.routing_table().policy();
        prop_assert!(policy.max_load_skew.is_finite() && policy.max_load_skew >= 1.0);
    }
}
