//! The model-name grammar of a worker's or a discovery source's `models`. The fleet-wide rule
//! (all entries declare models, or none) is [`Config::model_problems`](super::Config::model_problems),
//! with the worker list's other checks in [`super::members`].

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
