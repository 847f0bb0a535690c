//! The answers a worker sends, in the shapes vLLM and SGLang use: whole response bodies, and SSE
//! streams whose headers leave at once and whose first data chunk leaves right after prefill, so a
//! client measures time to first token as queueing plus prefill.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::generation::{Generation, Usage};
use super::request::{Api, Job};
use super::state::Shared;

/// Identity fields shared by every chunk of one response.
pub(super) struct ResponseIds {
    id: String,
    created: u64,
    model: String,
}

impl ResponseIds {
    /// Ids for the `n`-th response of the worker: `chatcmpl-<worker>-<n>` and the like, so ids never
    /// repeat within a fleet.
    pub(super) fn new(api: Api, shared: &Shared, n: u64) -> Self {
        let prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
            Api::Generate => "gen",
        };
        Self {
            id: format!("{prefix}-{}-{n}", shared.name),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: shared.config.model.clone(),
        }
    }
}

/// Every completion stops at its token limit: the simulated model never emits an end-of-sequence.
const FINISH_REASON: &str = "length";

/// SGLang's `meta_info` for `/generate`.
fn meta_info(id: &str, usage: &Usage, finished: bool) -> Value {
    json!({
        "id": id,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
        "finish_reason": if finished {
            json!({"type": "length", "length": usage.completion_tokens})
        } else {
            Value::Null
        },
    })
}

/// Runs the whole generation, then answers it in one body.
pub(super) async fn full_response(
    mut generation: Generation,
    job: Job,
    ids: ResponseIds,
) -> Response {
    generation.admit().await;
    while generation.next_token().await.is_some() {}
    generation.finish();
    let usage = generation.usage();
    let body = match job.api {
        Api::Chat => json!({
            "id": ids.id,
            "object": "chat.completion",
            "created": ids.created,
            "model": ids.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": generation.text()},
                "finish_reason": FINISH_REASON,
            }],
            "usage": usage,
        }),
        Api::Completion => json!({
            "id": ids.id,
            "object": "text_completion",
            "created": ids.created,
            "model": ids.model,
            "choices": [{
                "index": 0,
                "text": generation.text(),
                "logprobs": null,
                "finish_reason": FINISH_REASON,
            }],
            "usage": usage,
        }),
        Api::Generate => json!({
            "text": generation.text(),
            "meta_info": meta_info(&ids.id, &usage, true),
        }),
    };
    axum::Json(body).into_response()
}

/// Where a stream is.
enum Phase {
    /// Queue and prefill, then the first token.
    Start,
    /// One decode step per chunk.
    Decode,
    /// The usage chunk (only when requested).
    Usage,
    /// `data: [DONE]`.
    Done,
    /// Nothing more.
    End,
}

struct StreamState {
    generation: Generation,
    job: Job,
    ids: ResponseIds,
    phase: Phase,
}

fn sse(value: &Value) -> Bytes {
    let mut frame = Vec::with_capacity(256);
    frame.extend_from_slice(b"data: ");
    // Serialising a `Value` cannot fail.
    serde_json::to_writer(&mut frame, value).expect("JSON value serialises");
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

impl StreamState {
    fn token_chunk(&self, piece: &str, first: bool) -> Bytes {
        let ids = &self.ids;
        match self.job.api {
            Api::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": piece})
                } else {
                    json!({"content": piece})
                };
                sse(&json!({
                    "id": ids.id, "object": "chat.completion.chunk", "created": ids.created,
                    "model": ids.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
                }))
            }
            Api::Completion => sse(&json!({
                "id": ids.id, "object": "text_completion", "created": ids.created, "model": ids.model,
                "choices": [{"index": 0, "text": piece, "logprobs": null, "finish_reason": null}],
            })),
            // SGLang streams the cumulative text in every chunk.
            Api::Generate => sse(&json!({
                "text": self.generation.text(),
                "meta_info": meta_info(&ids.id, &self.generation.usage(), false),
            })),
        }
    }

    fn finish_chunk(&self) -> Bytes {
        let ids = &self.ids;
        match self.job.api {
            Api::Chat => sse(&json!({
                "id": ids.id, "object": "chat.completion.chunk", "created": ids.created,
                "model": ids.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": FINISH_REASON}],
            })),
            Api::Completion => sse(&json!({
                "id": ids.id, "object": "text_completion", "created": ids.created, "model": ids.model,
                "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": FINISH_REASON}],
            })),
            Api::Generate => sse(&json!({
                "text": self.generation.text(),
                "meta_info": meta_info(&ids.id, &self.generation.usage(), true),
            })),
        }
    }

    fn usage_chunk(&self) -> Bytes {
        let ids = &self.ids;
        let object = match self.job.api {
            Api::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        sse(&json!({
            "id": ids.id, "object": object, "created": ids.created, "model": ids.model,
            "choices": [], "usage": self.generation.usage(),
        }))
    }

    /// The next SSE frame, or `None` at the end of the stream.
    async fn next_frame(&mut self) -> Option<Bytes> {
        match self.phase {
            Phase::Start => {
                self.generation.admit().await;
                self.phase = Phase::Decode;
                // The first chunk goes out right after prefill, even for a zero-token limit, so the
                // client sees TTFT = queueing + prefill.
                let word = self.generation.next_token().await.unwrap_or("");
                Some(self.token_chunk(word, true))
            }
            Phase::Decode => match self.generation.next_token().await {
                Some(word) => Some(self.token_chunk(&format!(" {word}"), false)),
                None => {
                    self.generation.finish();
                    let wants_usage = self.job.include_usage && self.job.api != Api::Generate;
                    self.phase = if wants_usage {
                        Phase::Usage
                    } else {
                        Phase::Done
                    };
                    Some(self.finish_chunk())
                }
            },
            Phase::Usage => {
                self.phase = Phase::Done;
                Some(self.usage_chunk())
            }
            Phase::Done => {
                self.phase = Phase::End;
                Some(Bytes::from_static(b"data: [DONE]\n\n"))
            }
            Phase::End => None,
        }
    }
}

/// Answers with an SSE stream that runs the generation as the client reads it.
pub(super) fn stream_response(generation: Generation, job: Job, ids: ResponseIds) -> Response {
    let state = StreamState {
        generation,
        job,
        ids,
        phase: Phase::Start,
    };
    // Headers go out at once, as vLLM's streaming responses do; queueing and prefill happen while the
    // client already holds a 200, so TTFT is the first data chunk, not the headers.
    let frames = futures_util::stream::unfold(state, |mut state| async move {
        let frame = state.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), state))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(frames))
        .expect("static response parts are valid")
}
