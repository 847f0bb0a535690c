//! Every variant's answer on the wire, and the bodies and raw answers built from them.

use http::StatusCode;

use super::*;

#[test]
fn bodies_are_openai_shaped_with_type_by_plane() {
    let data = GatewayError::NoHealthyWorkers;
    let json: serde_json::Value = serde_json::from_slice(&data.body()).unwrap();
    assert_eq!(json["error"]["code"], "no_healthy_workers");
    assert_eq!(json["error"]["type"], "gateway_error");
    assert_eq!(
        json["error"]["message"],
        "no healthy worker can take the request"
    );
    assert_eq!(data.status(), StatusCode::SERVICE_UNAVAILABLE);
    let control = GatewayError::UnknownWorker("w9".into());
    let json: serde_json::Value = serde_json::from_slice(&control.body()).unwrap();
    assert_eq!(json["error"]["type"], "control_error");
    assert_eq!(json["error"]["message"], "no worker named \"w9\"");
    assert_eq!(control.status(), StatusCode::NOT_FOUND);
}

/// Every variant's status, OpenAI `type` and `code`, as clients see them (a change to any of
/// them is a change to the wire), and who caused it.
#[test]
fn every_variant_keeps_its_status_type_and_code() {
    use GatewayError as E;
    use Source::{Client, Gateway, Worker};
    let w = || "w1".to_owned();
    let s = || "text".to_owned();
    #[rustfmt::skip]
    let table: Vec<(GatewayError, u16, &str, &str, Source)> = vec![
        (E::PayloadTooLarge { length: None, limit: 1 }, 413, "gateway_error", "payload_too_large", Client),
        (E::NoHealthyWorkers, 503, "gateway_error", "no_healthy_workers", Worker),
        (E::NoWorkers, 503, "gateway_error", "no_healthy_workers", Gateway),
        (E::TargetWorkerMiss, 503, "gateway_error", "target_worker_miss", Client),
        (E::ModelNotFound(s()), 404, "gateway_error", "model_not_found", Client),
        (E::ModelRequired(s()), 400, "gateway_error", "model_required", Client),
        (E::WorkerGone(w()), 502, "gateway_error", "bad_worker_url", Gateway),
        (E::BadUpstreamUri(w()), 502, "gateway_error", "bad_worker_url", Gateway),
        (E::WorkerUnreachable(w()), 502, "gateway_error", "worker_unreachable", Worker),
        (E::WorkerBadResponse { worker: w(), reason: s() }, 502, "gateway_error", "invalid_worker_response", Worker),
        (E::UpstreamBodyBroken(w()), 502, "gateway_error", "upstream_stream_error", Worker),
        (E::IncompleteRequestBody, 400, "gateway_error", "incomplete_request_body", Client),
        (E::InvalidRequestBody(s()), 400, "gateway_error", "invalid_request_body", Client),
        (E::RequestBodyTimeout { timeout_ms: 1 }, 408, "gateway_error", "request_body_timeout", Client),
        (E::MissingHost, 400, "gateway_error", "missing_host", Client),
        (E::MissingControlHost, 400, "control_error", "missing_host", Client),
        (E::RepeatedHeader(s()), 400, "gateway_error", "repeated_header", Client),
        (E::TooManyHeaders { sent: 100, added: 1, limit: 100 }, 431, "gateway_error", "too_many_headers", Client),
        (E::TunnelNotSupported, 405, "gateway_error", "method_not_allowed", Client),
        (E::LoopDetected, 508, "gateway_error", "loop_detected", Gateway),
        (E::FirstByteTimeout { worker: w(), timeout_ms: 1 }, 504, "gateway_error", "first_byte_timeout", Worker),
        (E::Shed { reason: bch_core::admission::ShedReason::QueueFull, retry_after_secs: 1 }, 503, "gateway_error", "worker_overload_protection_shed", Gateway),
        (E::TooManyConnections, 503, "gateway_error", "too_many_connections", Gateway),
        (E::PickerUnavailable, 503, "gateway_error", "picker_unavailable", Gateway),
        (E::UpstreamStreamError, 502, "gateway_error", "upstream_stream_error", Worker),
        (E::NotFound, 404, "control_error", "not_found", Client),
        (E::Unauthorized, 401, "control_error", "unauthorized", Client),
        (E::HostNotAllowed(s()), 403, "control_error", "host_not_allowed", Client),
        (E::OriginNotAllowed(s()), 403, "control_error", "origin_not_allowed", Client),
        (E::UnsupportedMediaType, 415, "control_error", "unsupported_media_type", Client),
        (E::MethodNotAllowed, 405, "control_error", "method_not_allowed", Client),
        (E::ControlBodyTooLarge { limit: 1 }, 413, "control_error", "payload_too_large", Client),
        (E::InvalidJson(s()), 400, "control_error", "invalid_json", Client),
        (E::InvalidWorker(s()), 400, "control_error", "invalid_worker", Client),
        (E::WorkerConflict(s()), 409, "control_error", "worker_conflict", Client),
        (E::DiscoveredWorker(s()), 409, "control_error", "worker_discovered", Client),
        (E::UnknownWorker(s()), 404, "control_error", "unknown_worker", Client),
        (E::InvalidPolicy(s()), 400, "control_error", "invalid_policy", Client),
        (E::InvalidQuery(s()), 400, "control_error", "invalid_query", Client),
        (E::InvalidRoutingKey(s()), 400, "control_error", "invalid_routing_key", Client),
        (E::NoConfigFile(s()), 409, "control_error", "no_config_file", Client),
        (E::InvalidConfig(s()), 400, "control_error", "invalid_config", Client),
        (E::ConfigNotRendered(s()), 500, "control_error", "config_not_rendered", Gateway),
    ];
    for (error, status, error_type, code, source) in &table {
        let seen = (error.status().as_u16(), error.error_type(), error.code());
        assert_eq!(seen, (*status, *error_type, *code), "{error:?}");
        assert_eq!(error.caused_by(), *source, "{error:?}");
        let json: serde_json::Value = serde_json::from_slice(&error.body()).unwrap();
        assert_eq!(json["error"]["type"], *error_type, "{error:?}");
        assert_eq!(json["error"]["code"], *code, "{error:?}");
        assert_eq!(json["error"]["message"], error.to_string(), "{error:?}");
    }
    // `X-SMG-Error-Code`: SGLang Model Gateway's code where it has one for the situation, the
    // body's `code` for every other variant of the table.
    let smg_codes: Vec<(&str, &str)> = table
        .iter()
        .filter(|(error, ..)| error.smg_error_code() != error.code())
        .map(|(error, ..)| (error.code(), error.smg_error_code()))
        .collect();
    assert_eq!(
        smg_codes,
        [
            ("no_healthy_workers", "no_available_workers"),
            ("no_healthy_workers", "no_available_workers"),
            ("worker_unreachable", "no_worker_response"),
            ("invalid_worker_response", "no_worker_response"),
            ("upstream_stream_error", "no_worker_response"),
            ("incomplete_request_body", "invalid_body"),
            ("invalid_request_body", "invalid_body"),
            ("method_not_allowed", "unsupported_method"),
        ]
    );
    assert_eq!(
        GatewayError::ModelNotFound("m".into()).smg_error_code(),
        "model_not_found"
    );
    assert_eq!(
        GatewayError::WorkerTls(w(), "tls: certificate not trusted").smg_error_code(),
        "no_worker_response"
    );
}

#[test]
fn client_body_faults_are_the_clients_and_labelled_in_index_order() {
    for (i, fault) in ClientBodyFault::ALL.into_iter().enumerate() {
        assert_eq!(fault.index(), i);
    }
    let labels: Vec<&str> = ClientBodyFault::ALL.map(ClientBodyFault::as_str).to_vec();
    assert_eq!(labels, ["incomplete", "malformed", "too_large", "timeout"]);
    let refusals = [
        GatewayError::IncompleteRequestBody,
        GatewayError::InvalidRequestBody("x".into()),
        GatewayError::PayloadTooLarge {
            length: None,
            limit: 1,
        },
        GatewayError::RequestBodyTimeout { timeout_ms: 1 },
    ];
    let faults: Vec<Option<ClientBodyFault>> = refusals
        .iter()
        .inspect(|e| assert_eq!(e.caused_by(), Source::Client, "{e:?}"))
        .map(GatewayError::client_body_fault)
        .collect();
    assert_eq!(faults, ClientBodyFault::ALL.map(Some));
}

#[test]
fn payload_message_says_the_declared_length_when_known() {
    let declared = GatewayError::PayloadTooLarge {
        length: Some(10),
        limit: 4,
    };
    assert_eq!(
        declared.to_string(),
        "request body of 10 bytes exceeds the limit of 4 bytes"
    );
    let streamed = GatewayError::PayloadTooLarge {
        length: None,
        limit: 4,
    };
    assert_eq!(
        streamed.to_string(),
        "request body exceeds the limit of 4 bytes"
    );
}

#[test]
fn sse_error_event_carries_the_body() {
    let event = sse_stream_error_event();
    let text = std::str::from_utf8(&event).unwrap();
    let data = text
        .strip_prefix("\n\nevent: error\ndata: ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .unwrap();
    assert_eq!(
        data,
        r#"{"error":{"message":"the worker's stream ended abnormally","type":"gateway_error","code":"upstream_stream_error"}}"#
    );
}

#[test]
fn over_capacity_answer_is_well_formed_http() {
    let response = over_capacity_response();
    let response = std::str::from_utf8(&response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(length, body.len());
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["error"]["code"], "too_many_connections");
    assert!(
        head.lines()
            .any(|l| l == "x-smg-error-code: too_many_connections"),
        "{head}"
    );
}
