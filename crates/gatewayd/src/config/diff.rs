//! What changed between two configurations, in one line for the reload log:
//! `workers +gpu-2 -gpu-1; policy.min_load_gap 2 -> 3`, so an operator reading the journal sees
//! what a reload did without diffing files.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Config;

/// The changes from `before` to `after`: workers added (`+`), removed (`-`) and changed (`~`), by
/// name (defaulted names included), then every other field whose value changed, as `field old -> new`; `none` when
/// nothing changed.
pub fn describe(before: &Config, after: &Config) -> String {
    let mut parts = Vec::new();
    let names = |c: &Config| -> Vec<String> {
        c.members()
            .map(|m| m.into_iter().map(|m| m.spec.name).collect())
            .unwrap_or_default()
    };
    let (old, new) = (names(before), names(after));
    let mut workers: Vec<String> = new
        .iter()
        .filter(|n| !old.contains(n))
        .map(|n| format!("+{n}"))
        .collect();
    workers.extend(
        old.iter()
            .filter(|n| !new.contains(n))
            .map(|n| format!("-{n}")),
    );
    // A worker in both whose entry changed (its health_path, say), by name.
    let entry = |c: &Config, name: &str| {
        let members = c.members().ok()?;
        let i = members.iter().position(|m| m.spec.name == name)?;
        c.workers.get(i).cloned()
    };
    workers.extend(
        new.iter()
            .filter(|n| old.contains(n) && entry(before, n) != entry(after, n))
            .map(|n| format!("~{n}")),
    );
    if !workers.is_empty() {
        parts.push(format!("workers {}", workers.join(" ")));
    }
    let (old, new) = (fields(before), fields(after));
    for (field, value) in &new {
        match old.get(field) {
            Some(previous) if previous == value => {}
            Some(previous) => parts.push(format!("{field} {previous} -> {value}")),
            None => parts.push(format!("{field} -> {value}")),
        }
    }
    for (field, previous) in &old {
        if !new.contains_key(field) {
            parts.push(format!("{field} {previous} -> unset"));
        }
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join("; ")
    }
}

/// Every field outside the worker list as `section.field` → value (JSON text).
fn fields(config: &Config) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(Value::Object(sections)) = serde_json::to_value(config) else {
        return out;
    };
    for (section, value) in sections {
        if section == "workers" {
            continue;
        }
        match value {
            Value::Object(map) => {
                for (field, value) in map {
                    if !value.is_null() {
                        out.insert(format!("{section}.{field}"), value.to_string());
                    }
                }
            }
            other => {
                out.insert(section, other.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;

    #[test]
    fn names_workers_and_changed_fields() {
        let before = Config {
            workers: vec![
                WorkerConfig::from_url("http://a:1"),
                WorkerConfig::from_url("http://b:1"),
            ],
            ..Config::default()
        };
        let mut after = before.clone();
        assert_eq!(describe(&before, &after), "none");
        after.workers.remove(0);
        after.workers.push(WorkerConfig::from_url("http://c:1"));
        after.policy.min_load_gap = 5;
        let text = describe(&before, &after);
        assert!(text.starts_with("workers +c:1 -a:1; "), "{text}");
        assert!(text.contains("policy.min_load_gap 2 -> 5"), "{text}");
    }
}
