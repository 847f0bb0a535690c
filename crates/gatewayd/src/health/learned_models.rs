//! Learned models (`[health] learn_models`): with each probe round the prober also asks every
//! worker whose probe passed for its own `GET /v1/models` (OpenAI's list shape) and keeps what it
//! lists in the worker's record (`reported_models`). What a worker reports is shown, never
//! trusted: it adds no worker and changes no pool (the configured `models` decide), so a worker
//! that misreports (a typo, a model still loading) cannot pull requests of another model. A
//! worker whose ask fails keeps its last list.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;

use crate::config::{Config, Member};
use crate::per_worker::Check;
use crate::upstream::tls::WorkerConnector;

/// The most of a `/v1/models` answer read: a list of thousands of models fits.
const MAX_LIST_BYTES: usize = 1 << 20;

/// The models check: `/v1/models` on each worker's URL (`None`: no valid URI, never asked).
pub(super) struct ModelsList;

impl Check for ModelsList {
    type Target = Option<Uri>;

    fn path<'a>(_config: &'a Config, _member: &'a Member) -> &'a str {
        "/v1/models"
    }

    fn target(_member: &Member, _path: &str, uri: Option<Uri>) -> Self::Target {
        uri
    }
}

/// Asks `uri` for its model list within `timeout`: the sorted, deduplicated `data[].id`s, or
/// `None` when the worker did not answer a list (any failure: the caller keeps the last one).
pub(super) async fn ask(
    client: &Client<WorkerConnector, Empty<Bytes>>,
    uri: Option<&Uri>,
    timeout: Duration,
) -> Option<Vec<String>> {
    let request = Request::get(uri?.clone()).body(Empty::new()).ok()?;
    let answer = async {
        let response = client.request(request).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = Limited::new(response.into_body(), MAX_LIST_BYTES);
        Some(body.collect().await.ok()?.to_bytes())
    };
    let body = tokio::time::timeout(timeout, answer).await.ok()??;
    parse_list(&body)
}

/// The model ids of an OpenAI list (`{"object":"list","data":[{"id":..},..]}`), sorted and
/// deduplicated; `None` when `body` is not such a list. Entries without a string `id` are skipped.
pub(super) fn parse_list(body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<serde_json::Value>,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    let mut ids: Vec<String> = (list.data.iter())
        .filter_map(|entry| Some(entry.get("id")?.as_str()?.to_owned()))
        .collect();
    ids.sort();
    ids.dedup();
    Some(ids)
}

#[cfg(test)]
mod tests {
    use crate::health::learned_models::parse_list;

    #[test]
    fn lists_are_read_as_openai_writes_them() {
        let list = br#"{"object":"list","data":[{"id":"qwen","object":"model"},{"id":"llama","object":"model","owned_by":"x"},{"id":"qwen"},{"object":"model"}]}"#;
        assert_eq!(parse_list(list), Some(vec!["llama".into(), "qwen".into()]));
        assert_eq!(parse_list(br#"{"data":[]}"#), Some(vec![]));
        assert_eq!(parse_list(b"not json"), None);
        assert_eq!(parse_list(br#"{"models":["a"]}"#), None);
    }
}
