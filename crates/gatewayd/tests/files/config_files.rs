//! The files in `<workspace>/config/` are real configurations: each one loads and validates, and
//! the annotated reference `config/gatewayd.toml` mentions every configuration field and shows
//! every default, so it cannot drift from `Config`.

use std::path::PathBuf;

use gatewayd::config::{Config, DiscoveryConfig, WorkerConfig};

fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config")
}

fn toml_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(config_dir())
        .expect("config/ exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_config_file_loads_and_validates() {
    let files = toml_files();
    assert!(
        files.len() >= 2,
        "expected the reference and examples in {}, found {files:?}",
        config_dir().display()
    );
    for file in &files {
        let config = Config::load(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        config
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}

#[test]
fn the_reference_file_is_the_defaults() {
    // Every value in the reference is the default, so loading it must give exactly
    // `Config::default()` (the [[workers]] examples are commented out).
    let config = Config::load(&config_dir().join("gatewayd.toml")).unwrap();
    assert_eq!(config, Config::default());
}

#[test]
fn the_llama_cpp_example_uses_bounded_policy_and_v1_models() {
    let config = Config::load(&config_dir().join("llama-cpp.toml")).unwrap();
    assert_eq!(
        config.policy.kind,
        bch_core::policy::PolicyKind::BoundedConsistentHashing
    );
    let urls: Vec<&str> = config.workers.iter().map(|w| w.url.as_str()).collect();
    assert_eq!(urls, ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]);
    for worker in &config.workers {
        assert_eq!(worker.health_path.as_deref(), Some("/v1/models"));
        assert_eq!(
            config.probe_path(worker.health_path.as_deref()),
            "/v1/models"
        );
    }
}

/// Dotted paths of every key of a JSON value (`server.listen`, `workers.url`, ...).
fn walk(prefix: &str, value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                out.push(path.clone());
                walk(&path, child, out);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                walk(prefix, item, out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_reference_mentions_every_field() {
    let mut config = Config::default();
    // One fully specified worker and discovery source so the walk sees every `[[workers]]` and
    // `[[discovery]]` field too; optional fields
    // serialise as null in JSON (TOML would drop them).
    config.workers.push(WorkerConfig {
        name: Some("w".into()),
        url: "http://127.0.0.1:1".into(),
        ring_id: Some("r".into()),
        health_path: Some("/h".into()),
        metrics_path: None,
        max_in_flight: Some(4),
        server_name: None,
        models: Vec::new(),
    });
    config.discovery.push(DiscoveryConfig {
        port: Some(8000),
        resolver: Some("127.0.0.1:53".parse().unwrap()),
        health_path: Some("/h".into()),
        max_in_flight: Some(4),
        ..DiscoveryConfig::new("llm.test")
    });
    let value = serde_json::to_value(&config).unwrap();
    let mut fields = Vec::new();
    walk("", &value, &mut fields);
    assert!(fields.len() > 30, "walk found too few fields: {fields:?}");
    let reference = std::fs::read_to_string(config_dir().join("gatewayd.toml")).unwrap();
    // (section, key) pairs the reference sets or shows commented out, in the section they belong to.
    let mut documented: Vec<(String, String)> = Vec::new();
    let mut section = String::new();
    for line in reference.lines() {
        // Uncomment one level: `# name = "gpu-0"` counts, `# # Unique name` stays a comment.
        let line = line.trim();
        let line = line.strip_prefix('#').unwrap_or(line).trim();
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_matches(|c| c == '[' || c == ']').to_owned();
            documented.push((String::new(), section.clone()));
            // A nested header (`[upstream.tls]`) also documents the tables above it and the key
            // that names it in its parent (`upstream`, and `tls` in `upstream`).
            let mut parent = String::new();
            for part in section.split('.') {
                let path = if parent.is_empty() {
                    part.to_owned()
                } else {
                    format!("{parent}.{part}")
                };
                documented.push((String::new(), path.clone()));
                documented.push((parent, part.to_owned()));
                parent = path;
            }
        } else if let Some((key, _)) = line.split_once(" = ")
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            documented.push((section.clone(), key.to_owned()));
        }
    }
    let mut missing = Vec::new();
    for field in &fields {
        let (section, name) = field.rsplit_once('.').unwrap_or(("", field.as_str()));
        if !documented.iter().any(|(s, k)| s == section && k == name) {
            missing.push(field.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "config/gatewayd.toml does not document {missing:?}"
    );
}
