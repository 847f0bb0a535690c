//! A fake Envoy for the endpoint picker's tests: one ext_proc stream driven by a tonic client as
//! Envoy's filter drives it, and the messages Envoy sends (request and response headers, with the
//! served endpoint) and reads back (the pick, the response headers the picker sets).

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tonic::Streaming;

/// One ext_proc stream, as Envoy's filter drives it.
pub struct FakeEnvoy {
    to_picker: Option<mpsc::Sender<ProcessingRequest>>,
    /// The picker's answers, in order (a test may read the end of the stream itself).
    pub answers: Streaming<ProcessingResponse>,
}

impl FakeEnvoy {
    pub async fn open(picker: SocketAddr) -> Self {
        Self::try_open(picker).await.expect("stream opens")
    }

    /// Opens a stream on its own connection; `Err` when the picker refuses it.
    pub async fn try_open(picker: SocketAddr) -> Result<Self, tonic::Status> {
        let mut client = ExternalProcessorClient::connect(format!("http://{picker}"))
            .await
            .expect("picker reachable");
        let (tx, mut rx) = mpsc::channel(8);
        let outbound = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let answers = client.process(outbound).await?.into_inner();
        Ok(Self {
            to_picker: Some(tx),
            answers,
        })
    }

    pub async fn send(&mut self, message: ProcessingRequest) {
        self.to_picker
            .as_ref()
            .expect("stream still open")
            .send(message)
            .await
            .expect("picker reads");
    }

    pub async fn answer(&mut self) -> ProcessingResponse {
        tokio::time::timeout(Duration::from_secs(5), self.answers.next())
            .await
            .expect("an answer in time")
            .expect("stream not ended")
            .expect("no gRPC error")
    }

    pub async fn exchange(&mut self, message: ProcessingRequest) -> ProcessingResponse {
        self.send(message).await;
        self.answer().await
    }

    /// Envoy half-closes its side, as its filter does when the HTTP stream ends.
    pub fn close(&mut self) {
        self.to_picker = None;
    }
}

/// Envoy's header list for `pairs` (values as raw bytes, as Envoy 1.40 sends them).
pub fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// The first message of a stream: the request headers, with `protocol_config` as Envoy sends it.
pub fn request_headers(pairs: &[(&str, &str)]) -> ProcessingRequest {
    let mut all = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "envoy"),
    ];
    all.extend_from_slice(pairs);
    ProcessingRequest {
        protocol_config: Some(ProtocolConfiguration::default()),
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(&all)),
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// The response headers, with the endpoint Envoy served from (`selected_host_key`), if any.
pub fn response_headers(served: Option<&str>, end_of_stream: bool) -> ProcessingRequest {
    let metadata_context = served.map(|served| Metadata {
        filter_metadata: [(
            "envoy.lb".to_owned(),
            Struct {
                fields: [(
                    "x-gateway-destination-endpoint-served".to_owned(),
                    Value {
                        kind: Some(Kind::StringValue(served.to_owned())),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Metadata::default()
    });
    ProcessingRequest {
        metadata_context,
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(&[(":status", "200")])),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// The picked endpoints of an answer to the request headers: the header's and the metadata's
/// values (the protocol wants them equal).
pub fn picked(answer: &ProcessingResponse) -> (String, String) {
    let Some(Response::RequestHeaders(headers)) = &answer.response else {
        panic!("not a request-headers answer: {answer:?}");
    };
    let mutation = headers
        .response
        .as_ref()
        .and_then(|r| r.header_mutation.as_ref())
        .expect("a header mutation");
    let header = mutation
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == "x-gateway-destination-endpoint")
        .expect("the destination header");
    let metadata = answer.dynamic_metadata.as_ref().expect("dynamic metadata");
    let Some(Kind::StructValue(lb)) = &metadata.fields["envoy.lb"].kind else {
        panic!("envoy.lb is a struct");
    };
    let Some(Kind::StringValue(value)) = &lb.fields["x-gateway-destination-endpoint"].kind else {
        panic!("the metadata value is a string");
    };
    (
        String::from_utf8(header.raw_value.clone()).unwrap(),
        value.clone(),
    )
}

/// The response headers an answer to Envoy's response headers sets.
pub fn set_headers(answer: &ProcessingResponse) -> Vec<(String, String)> {
    let Some(Response::ResponseHeaders(headers)) = &answer.response else {
        panic!("not a response-headers answer: {answer:?}");
    };
    headers
        .response
        .as_ref()
        .and_then(|r| r.header_mutation.as_ref())
        .map(|m| {
            m.set_headers
                .iter()
                .filter_map(|o| o.header.as_ref())
                .map(|h| {
                    (
                        h.key.clone(),
                        String::from_utf8(h.raw_value.clone()).unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
