//! The three request shapes a worker accepts (OpenAI chat, OpenAI text completion, SGLang
//! `/generate`), read into one [`Job`]: prompt text, token limit and streaming options. Rejections
//! are a sentence saying which field is wrong, for the OpenAI error body.

use serde_json::Value;

/// The three request shapes the worker understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
    /// `POST /generate` (SGLang native).
    Generate,
}

/// What a request asks for, whatever its shape.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) api: Api,
    pub(super) prompt: String,
    pub(super) max_tokens: u32,
    pub(super) stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub(super) include_usage: bool,
}

/// Reads a request body of shape `api`; `default_max_tokens` applies when it names no limit.
pub(super) fn parse_job(api: Api, body: &[u8], default_max_tokens: u32) -> Result<Job, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let (prompt, limit) = match api {
        Api::Chat => (
            chat_prompt(&v)?,
            v.get("max_completion_tokens")
                .or_else(|| v.get("max_tokens")),
        ),
        Api::Completion => (completion_prompt(&v)?, v.get("max_tokens")),
        Api::Generate => (
            generate_prompt(&v)?,
            v.pointer("/sampling_params/max_new_tokens"),
        ),
    };
    Ok(Job {
        api,
        prompt,
        max_tokens: token_limit(limit, default_max_tokens)?,
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// A token limit field: absent or `null` means the default.
fn token_limit(value: Option<&Value>, default: u32) -> Result<u32, String> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("token limit must be a non-negative integer, got {n}")),
    }
}

/// The messages' text joined by newlines: a chat template would add a few tokens per message, which
/// does not change anything the simulation is for.
fn chat_prompt(v: &Value) -> Result<String, String> {
    let messages = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be an array")?;
    let mut prompt = String::new();
    for m in messages {
        let text = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        if !prompt.is_empty() {
            prompt.push('\n');
        }
        prompt.push_str(&text);
    }
    Ok(prompt)
}

/// `prompt` as a string, or a list of strings joined by newlines.
fn completion_prompt(v: &Value) -> Result<String, String> {
    match v.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => Ok(items
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n")),
        _ => Err("`prompt` must be a string".into()),
    }
}

/// SGLang's `text`.
fn generate_prompt(v: &Value) -> Result<String, String> {
    v.get("text")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "`text` must be a string".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_joins_message_contents() {
        let body = br#"{"messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":"there"}]}],
            "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}"#;
        let job = parse_job(Api::Chat, body, 16).unwrap();
        assert_eq!(job.prompt, "be brief\nhello\nthere");
        assert_eq!(job.max_tokens, 3);
        assert!(job.stream && job.include_usage);
    }

    #[test]
    fn generate_reads_sglang_sampling_params() {
        let body = br#"{"text":"abc","sampling_params":{"max_new_tokens":5}}"#;
        let job = parse_job(Api::Generate, body, 16).unwrap();
        assert_eq!(
            (job.prompt.as_str(), job.max_tokens, job.stream),
            ("abc", 5, false)
        );
        let job = parse_job(Api::Generate, br#"{"text":"abc"}"#, 16).unwrap();
        assert_eq!(job.max_tokens, 16);
    }

    #[test]
    fn bad_bodies_are_rejected_with_a_reason() {
        assert!(
            parse_job(Api::Chat, b"{", 16)
                .unwrap_err()
                .contains("invalid JSON")
        );
        assert!(
            parse_job(Api::Chat, b"{}", 16)
                .unwrap_err()
                .contains("messages")
        );
        assert!(
            parse_job(Api::Completion, b"{}", 16)
                .unwrap_err()
                .contains("prompt")
        );
        let neg = br#"{"prompt":"x","max_tokens":-1}"#;
        assert!(
            parse_job(Api::Completion, neg, 16)
                .unwrap_err()
                .contains("token limit")
        );
    }
}
