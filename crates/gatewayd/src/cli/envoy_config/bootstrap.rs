//! The Envoy v3 bootstrap written from an [`EnvoyPlan`]: the listener with its ext_proc filter,
//! the workers cluster the picker's answers select from, and the picker's cluster. Writing cannot
//! fail: every check was made when the plan was.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use super::plan::EnvoyPlan;
use crate::cli::envoy_tls::picker_transport_socket;
use crate::cli::envoy_worker_tls::{endpoint_metadata, workers_transport_socket_matches};
use crate::error::GatewayError;
use crate::picker::messages::{DESTINATION_KEY, LB_NAMESPACE, SERVED_KEY};

/// An endpoint metadata key no endpoint has: the workers cluster's fallback load balancer selects
/// the subset of endpoints carrying it, which is empty, so it never picks an endpoint the picker
/// did not list.
const NO_SUBSET_KEY: &str = "bch_no_endpoint";

/// The Envoy v3 bootstrap for `plan`, as YAML.
pub fn bootstrap(plan: &EnvoyPlan) -> String {
    let mut yaml = String::with_capacity(8 * 1024);
    let _ = write!(
        yaml,
        "# Envoy v3 bootstrap from `gatewayd envoy-config` (docs/envoy.md). Envoy proxies; gatewayd's\n\
         # endpoint picker at {picker} chooses each request's worker (ext_proc, Gateway API\n\
         # Inference Extension endpoint-picker protocol) and holds its load until the stream ends.\n\
         node:\n  id: bch-envoy\n  cluster: bch\n",
        picker = plan.picker,
    );
    if let Some(admin) = plan.admin {
        let _ = write!(
            yaml,
            "admin:\n  address:\n    socket_address: {}\n",
            socket_address(admin)
        );
    }
    yaml.push_str("static_resources:\n  listeners:\n");
    listener(&mut yaml, plan);
    yaml.push_str("  clusters:\n");
    workers_cluster(&mut yaml, plan);
    picker_cluster(&mut yaml, plan);
    yaml
}

fn listener(yaml: &mut String, plan: &EnvoyPlan) {
    let idle = seconds(plan.stream_idle_timeout);
    let message_timeout = seconds(plan.message_timeout);
    let _ = write!(
        yaml,
        r#"  - name: bch
    address:
      socket_address: {listen}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bch
          codec_type: AUTO
          # SSE: no whole-request deadline; a stream ends after {idle} of silence instead.
          request_timeout: 0s
          stream_idle_timeout: {idle}
          # One x-request-id from the client to the worker, through the picker's log line: a
          # client's own id is kept (by default Envoy replaces it on requests from outside), and
          # a request without one gets one from Envoy.
          generate_request_id: true
          preserve_external_request_id: true
          # Envoy answers 500 with no body when it cannot reach the picker: make that the
          # OpenAI-shaped 503 gatewayd itself would send. (The picker's own refusals are
          # immediate responses with their body set, and pass unchanged.)
          local_reply_config:
            mappers:
            - filter:
                status_code_filter:
                  comparison:
                    op: EQ
                    value:
                      default_value: 500
                      runtime_key: bch.picker_failure_status
              status_code: {unavailable_status}
              body:
                inline_string: '{unavailable_body}'
              body_format_override:
                text_format_source:
                  inline_string: "%LOCAL_REPLY_BODY%"
                content_type: application/json
          route_config:
            name: bch
            virtual_hosts:
            - name: workers
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: bch_workers
                  timeout: 0s
                  idle_timeout: {idle}
                  # The picked endpoint, then its fallbacks in ring order: retried only when
                  # nothing reached the worker, as gatewayd's own data plane does.
                  retry_policy:
                    retry_on: connect-failure,reset-before-request
                    num_retries: {retries}
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc:
                  cluster_name: bch_picker
              # Without the picker, requests fail (500) rather than bypass the policy.
              failure_mode_allow: false
              # The picker holds its answer while a request waits for a slot ([admission]).
              message_timeout: {message_timeout}
              max_message_timeout: {message_timeout}
              # Request headers: the pick. Response headers: the served endpoint and the x-bch-*
              # headers. No body passes through the picker. Response trailers SEND keeps the
              # ext_proc stream open until the response ends (a response without trailers costs
              # no message), and the picker holds the request's load until that stream ends.
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: NONE
                response_body_mode: NONE
                request_trailer_mode: SKIP
                response_trailer_mode: SEND
              metadata_options:
                forwarding_namespaces:
                  untyped: [{lb}]
                receiving_namespaces:
                  untyped: [{lb}]
              # Only what the picker reads: the routing headers, the declared size, the status,
              # and the method, path and x-request-id of its request log line.
              forward_rules:
                allowed_headers:
                  patterns:
{allowed}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
        listen = socket_address(plan.listen),
        unavailable_status = GatewayError::PickerUnavailable.status().as_u16(),
        unavailable_body = yaml_single_quoted(&GatewayError::PickerUnavailable.body()),
        retries = plan.fallbacks,
        lb = LB_NAMESPACE,
        allowed = plan
            .forwarded_headers
            .iter()
            .map(|h| format!("                  - exact: \"{h}\"\n"))
            .collect::<String>(),
    );
}

fn workers_cluster(yaml: &mut String, plan: &EnvoyPlan) {
    let _ = write!(
        yaml,
        r#"  - name: bch_workers
    type: STATIC
    connect_timeout: {connect}
    # Envoy goes where the picker says: the first endpoint of its list, the next one on a retry.
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - metadata:
                key: {lb}
                path:
                - key: {destination}
            # Tells the picker which endpoint served (the load moves there after a retry).
            selected_host_key:
              key: {lb}
              path:
              - key: {served}
            # Once the picked endpoints are spent (a target-worker request has no fallback; a
            # retry past the last fallback) or none is in this cluster: no endpoint, the attempt
            # fails (503 no healthy upstream). A round-robin fallback here sent a target-worker
            # request whose worker failed its TLS handshake to another worker, unasked.
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.subset
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.subset.v3.Subset
                    fallback_policy: NO_FALLBACK
                    subset_selectors:
                    - keys: [{no_subset}]
                    subset_lb_policy:
                      policies:
                      - typed_extension_config:
                          name: envoy.load_balancing_policies.round_robin
                          typed_config:
                            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
{breakers}    load_assignment:
      cluster_name: bch_workers
      endpoints:
      - lb_endpoints:
"#,
        connect = seconds(plan.connect_timeout),
        lb = LB_NAMESPACE,
        destination = DESTINATION_KEY,
        served = SERVED_KEY,
        breakers = circuit_breakers(),
        no_subset = NO_SUBSET_KEY,
    );
    if plan.workers.is_empty() {
        yaml.truncate(yaml.len() - "      - lb_endpoints:\n".len());
        yaml.push_str("      - lb_endpoints: []\n");
    }
    for (index, worker) in plan.workers.iter().enumerate() {
        let _ = writeln!(
            yaml,
            "        - endpoint:\n            address:\n              socket_address: {}",
            socket_address(*worker)
        );
        let tls_entry = plan
            .worker_tls
            .as_ref()
            .and_then(|tls| tls.endpoint_names.get(index).copied().flatten());
        if let Some(entry) = tls_entry {
            endpoint_metadata(yaml, entry);
        }
    }
    if let Some(tls) = &plan.worker_tls {
        workers_transport_socket_matches(yaml, tls);
    }
}

fn picker_cluster(yaml: &mut String, plan: &EnvoyPlan) {
    let _ = write!(
        yaml,
        r#"  - name: bch_picker
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            connection_keepalive:
              interval: 20s
              timeout: 10s
{breakers}    load_assignment:
      cluster_name: bch_picker
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {picker}
"#,
        breakers = circuit_breakers(),
        picker = socket_address(plan.picker),
    );
    if let Some(tls) = &plan.picker_tls {
        picker_transport_socket(yaml, tls, plan.picker);
    }
}

/// Envoy's defaults (1,024 connections, requests and pending requests, 3 concurrent retries per
/// cluster) would refuse a fleet's held streams long before gatewayd would; raised out of the way.
fn circuit_breakers() -> &'static str {
    "    circuit_breakers:\n      thresholds:\n      - max_connections: 1000000\n        max_pending_requests: 1000000\n        max_requests: 1000000\n        max_retries: 1000000\n"
}

fn socket_address(addr: SocketAddr) -> String {
    format!(
        "{{ address: \"{}\", port_value: {} }}",
        addr.ip(),
        addr.port()
    )
}

/// The inside of a single-quoted YAML scalar (quotes doubled).
fn yaml_single_quoted(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\'', "''")
}

fn seconds(duration: Duration) -> String {
    let ms = crate::config::millis::as_millis(duration);
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::envoy_config::plan::{EnvoyConfigArgs, forwarded_headers};
    use crate::cli::envoy_tls::EnvoyPickerTlsArgs;
    use crate::cli::envoy_worker_tls::EnvoyWorkerTlsArgs;
    use crate::config::Config;
    use std::path::PathBuf;

    fn plan(workers: &[&str]) -> EnvoyPlan {
        EnvoyPlan {
            listen: "127.0.0.1:10000".parse().unwrap(),
            picker: "127.0.0.1:9002".parse().unwrap(),
            admin: None,
            workers: workers.iter().map(|w| w.parse().unwrap()).collect(),
            fallbacks: 2,
            connect_timeout: Duration::from_millis(2000),
            stream_idle_timeout: Duration::from_millis(300_500),
            message_timeout: Duration::from_millis(3_000),
            forwarded_headers: forwarded_headers(&Config::default()),
            discovery: Vec::new(),
            picker_tls: None,
            worker_tls: None,
        }
    }

    #[test]
    fn the_bootstrap_names_every_worker_and_the_protocol_keys() {
        let yaml = bootstrap(&plan(&["127.0.0.1:8101", "[::1]:8102"]));
        assert!(yaml.contains("socket_address: { address: \"127.0.0.1\", port_value: 8101 }"));
        assert!(yaml.contains("socket_address: { address: \"::1\", port_value: 8102 }"));
        assert!(yaml.contains("- key: x-gateway-destination-endpoint\n"));
        assert!(yaml.contains("- key: x-gateway-destination-endpoint-served\n"));
        assert!(yaml.contains("failure_mode_allow: false"));
        assert!(yaml.contains(
            "                    fallback_policy: NO_FALLBACK\n                    subset_selectors:\n                    - keys: [bch_no_endpoint]\n"
        ));
        assert!(yaml.contains("response_trailer_mode: SEND"));
        for header in [
            "x-smg-routing-key",
            "x-smg-target-worker",
            "authorization",
            ":status",
        ] {
            assert!(
                yaml.contains(&format!("- exact: \"{header}\"\n")),
                "{header}"
            );
        }
        assert!(yaml.contains(r#"inline_string: '{"error":{"message":"the endpoint picker is unavailable","type":"gateway_error","code":"picker_unavailable"}}'"#));
        assert!(yaml.contains("num_retries: 2"));
        assert!(yaml.contains("stream_idle_timeout: 300.500s"));
        assert!(yaml.contains("message_timeout: 3s"), "{yaml}");
        assert!(!yaml.contains("admin:"));
        assert!(!yaml.contains('\t'));
    }

    /// The picker's log line needs the client's method, path and request id: Envoy forwards only
    /// the headers the allow-list names, pseudo-headers included, so without them every line said
    /// `method=GET path="/"` with an id of the picker's own.
    #[test]
    fn the_bootstrap_forwards_what_the_picker_logs_and_keeps_the_clients_request_id() {
        let yaml = bootstrap(&plan(&["127.0.0.1:8101"]));
        let allowed = yaml
            .split("allowed_headers:")
            .nth(1)
            .and_then(|rest| rest.split("- name: envoy.filters.http.router").next())
            .expect("an allow-list before the router");
        for header in [":method", ":path", "x-request-id"] {
            assert!(
                allowed.contains(&format!("- exact: \"{header}\"\n")),
                "{header} is forwarded to the picker: {allowed}"
            );
        }
        assert!(yaml.contains("          preserve_external_request_id: true\n"));
        assert!(yaml.contains("          generate_request_id: true\n"));
    }

    #[test]
    fn an_empty_fleet_is_an_empty_endpoint_list() {
        let yaml = bootstrap(&plan(&[]));
        assert!(yaml.contains("      - lb_endpoints: []\n  - name: bch_picker"));
    }

    /// A bootstrap for https workers over mutual TLS, each with its own server name, beside a
    /// plain worker, is one Envoy accepts: `envoy --mode validate` loads it, the certificate
    /// files included. Envoy is `BCH_ENVOY_BIN`, else
    /// tests/envoy/.venv/bin/envoy (made by tests/envoy/run.sh); without one the check is skipped.
    #[test]
    fn envoy_validates_a_bootstrap_for_https_workers_with_client_certificates_and_own_names() {
        let envoy = std::env::var_os("BCH_ENVOY_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/envoy/.venv/bin/envoy")
            });
        if !envoy.is_file() {
            eprintln!(
                "skipped: no Envoy at {} (set BCH_ENVOY_BIN)",
                envoy.display()
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let certified = rcgen::generate_simple_self_signed(vec!["workers.bch.svc".to_owned()])
            .expect("certificate");
        let cert = dir.path().join("client.crt");
        let key = dir.path().join("client.key");
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        let mut toml = format!(
            "[upstream.tls]\nca_file = {cert:?}\nclient_cert_file = {cert:?}\nclient_key_file = {key:?}\n"
        );
        for (address, name) in [
            ("127.0.0.1:8443", "w0.bch.svc"),
            ("127.0.0.2:8443", "w1.bch.svc"),
        ] {
            toml.push_str(&format!(
                "[[workers]]\nurl = \"https://{address}\"\nserver_name = \"{name}\"\n"
            ));
        }
        toml.push_str("[[workers]]\nurl = \"http://127.0.0.3:8000\"\n");
        let path = dir.path().join("gatewayd.toml");
        std::fs::write(&path, toml).unwrap();
        let args = EnvoyConfigArgs {
            listen: "127.0.0.1:10000".parse().unwrap(),
            picker: "127.0.0.1:9002".parse().unwrap(),
            config: Some(path),
            workers: Vec::new(),
            admin: None,
            picker_tls: EnvoyPickerTlsArgs::default(),
            worker_tls: EnvoyWorkerTlsArgs::default(),
        };
        let yaml = bootstrap(&EnvoyPlan::from_args(&args).unwrap());
        for line in [
            "          sni: \"w0.bch.svc\"\n",
            "          sni: \"w1.bch.svc\"\n",
            "              socket_address: { address: \"127.0.0.2\", port_value: 8443 }\n          metadata:\n            filter_metadata:\n              envoy.transport_socket_match: { bch_worker_tls: \"1\" }\n",
            "              socket_address: { address: \"127.0.0.3\", port_value: 8000 }\n    # The https workers",
        ] {
            assert!(yaml.contains(line), "{line} in {yaml}");
        }
        let bootstrap_file = dir.path().join("envoy.yaml");
        std::fs::write(&bootstrap_file, &yaml).unwrap();
        let output = std::process::Command::new(&envoy)
            .args(["--mode", "validate", "-c"])
            .arg(&bootstrap_file)
            .output()
            .expect("run envoy");
        assert!(
            output.status.success(),
            "envoy --mode validate: {}\n{}{yaml}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
