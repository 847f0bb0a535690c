//! The models a fleet serves, as configured: the model-name grammar of a worker's or a discovery
//! source's `models`, and the fleet-wide rule that either no worker declares a model (one pool of
//! every worker, nothing reads a request body) or every worker does (a pool per model, routed by
//! the body's `model`). A worker without models in a fleet with models would be in no pool, so
//! no request could reach it: refused, naming the entry.

use std::collections::BTreeSet;

use super::Config;
use super::field_error::FieldError;

/// Longest model name accepted, in bytes (Hugging Face ids are well under it).
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// Checks one entry's `models`: each name non-empty, at most [`MAX_MODEL_NAME_BYTES`] bytes,
/// without control characters or a space at either end, and none twice. The error is relative
/// to the entry (field `models`).
pub fn check_models(models: &[String]) -> Result<(), FieldError> {
    let invalid = |message: String| Err(FieldError::new("models", message));
    for (index, name) in models.iter().enumerate() {
        if name.is_empty() {
            return invalid("a model name must not be empty".into());
        }
        if name.len() > MAX_MODEL_NAME_BYTES {
            return invalid(format!(
                "{name:?} is longer than {MAX_MODEL_NAME_BYTES} bytes"
            ));
        }
        if name.chars().any(char::is_control) || name.trim() != name {
            return invalid(format!(
                "{name:?}: a model name has no control character and no space at either end"
            ));
        }
        if models[..index].contains(name) {
            return invalid(format!("{name:?} is listed twice"));
        }
    }
    Ok(())
}

impl Config {
    /// Every model a `[[workers]]` or `[[discovery]]` entry declares, sorted.
    pub fn declared_models(&self) -> BTreeSet<&str> {
        let workers = self.workers.iter().map(|w| &w.models);
        let sources = self.discovery.iter().map(|s| &s.models);
        workers
            .chain(sources)
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// The fleet-wide model rules: when any entry declares models, every `[[workers]]` and
    /// `[[discovery]]` entry must (the first that does not is named, with one that does), and
    /// `[routing] default_model` must be one of the declared models.
    pub fn model_problems(&self) -> Vec<FieldError> {
        let declaring = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("workers[{i}]"), &w.models))
            .chain(
                self.discovery
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (format!("discovery[{i}]"), &s.models)),
            );
        let (with, without): (Vec<_>, Vec<_>) = declaring.partition(|(_, m)| !m.is_empty());
        let mut problems = Vec::new();
        if let (Some((example, models)), Some((entry, _))) = (with.first(), without.first()) {
            problems.push(
                FieldError::new(
                    "models",
                    format!(
                        "this entry declares no model, but {example} serves {:?}: with models configured every worker names the models it serves (a worker without models would get no request)",
                        models[0]
                    ),
                )
                .within(entry),
            );
        }
        if let Some(default) = &self.routing.default_model {
            let declared = self.declared_models();
            if !declared.is_empty() && !declared.contains(default.as_str()) {
                problems.push(FieldError::new(
                    "routing.default_model",
                    format!(
                        "{default:?} is not a model any worker serves (declared: {declared:?})"
                    ),
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;

    fn worker(url: &str, models: &[&str]) -> WorkerConfig {
        WorkerConfig {
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            ..WorkerConfig::from_url(url)
        }
    }

    #[test]
    fn model_names_follow_the_grammar() {
        let names = |list: &[&str]| -> Vec<String> { list.iter().map(|m| (*m).into()).collect() };
        assert!(check_models(&names(&["meta-llama/Llama-3.1-8B-Instruct", "qwen"])).is_ok());
        for (bad, says) in [
            (names(&[""]), "empty"),
            (names(&[" m"]), "space"),
            (names(&["m\n"]), "control"),
            (names(&["m", "m"]), "twice"),
            (vec!["x".repeat(257)], "longer"),
        ] {
            let error = check_models(&bad).unwrap_err();
            assert_eq!(error.field, "models");
            assert!(error.message.contains(says), "{error:?}");
        }
    }

    #[test]
    fn a_fleet_with_models_names_every_workers_models() {
        let mut config = Config::default();
        config.workers = vec![
            worker("http://127.0.0.1:9001", &["llama"]),
            worker("http://127.0.0.1:9002", &[]),
        ];
        let problems = config.model_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "workers[1].models");
        assert!(
            problems[0].message.contains("workers[0] serves \"llama\""),
            "{problems:?}"
        );
        config.workers[1].models = vec!["qwen".into()];
        assert!(config.model_problems().is_empty());
        assert_eq!(
            config.declared_models().into_iter().collect::<Vec<_>>(),
            ["llama", "qwen"]
        );
        config.routing.default_model = Some("mistral".into());
        let problems = config.model_problems();
        assert_eq!(problems[0].field, "routing.default_model");
        config.routing.default_model = Some("qwen".into());
        assert!(config.model_problems().is_empty());
    }
}
