//! The workers' half of `gatewayd envoy-config`'s TLS: in picker mode Envoy, not gatewayd, carries
//! the requests, so `https://` workers need upstream TLS on Envoy's worker cluster, made from the
//! same `[upstream.tls]` settings gatewayd's prober and scraper use (flags may name Envoy's own
//! copies of the files). Each worker is checked against its own certificate name, as gatewayd
//! checks it: the cluster gets one `transport_socket_matches` entry per distinct name and every
//! https endpoint the metadata that selects its entry; http endpoints match none and stay plain.
//! docs/envoy.md "https workers behind Envoy" explains the choices.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;
use rustls_pki_types::ServerName;

use super::envoy_tls::{quoted, quoted_path};
use crate::config::{Config, Member};

/// The endpoint metadata key (under `envoy.transport_socket_match`) that names a worker's TLS
/// entry in the cluster's `transport_socket_matches`.
pub const WORKER_TLS_MATCH_KEY: &str = "bch_worker_tls";

/// Envoy's files for `https://` workers, when they are not at `[upstream.tls]`'s paths on
/// Envoy's host.
#[derive(Debug, Clone, Default, Args)]
pub struct EnvoyWorkerTlsArgs {
    /// CA certificates (PEM) Envoy trusts for https workers; default `[upstream.tls] ca_file`.
    #[arg(long, value_name = "FILE")]
    pub worker_ca_file: Option<PathBuf>,
    /// Envoy's client certificate chain (PEM) for workers that require one; default
    /// `[upstream.tls] client_cert_file`.
    #[arg(long, value_name = "FILE", requires = "worker_client_key_file")]
    pub worker_client_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --worker-client-cert-file; default `[upstream.tls]
    /// client_key_file`.
    #[arg(long, value_name = "FILE", requires = "worker_client_cert_file")]
    pub worker_client_key_file: Option<PathBuf>,
}

/// The name Envoy checks in a worker's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerCertificateName {
    /// A DNS name: sent as SNI and required among the certificate's DNS names.
    Dns(String),
    /// An IP address: required among the certificate's IP addresses (no SNI: it cannot carry one).
    Ip(String),
}

/// How Envoy reaches `https://` workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerTlsPlan {
    /// The CA file Envoy verifies the workers' certificates with.
    pub ca_file: PathBuf,
    /// Envoy's client certificate and key, for workers that require one.
    pub client: Option<(PathBuf, PathBuf)>,
    /// The distinct certificate names of the https workers, in configuration order: one
    /// `transport_socket_matches` entry each.
    pub names: Vec<WorkerCertificateName>,
    /// Per member, in configuration order (the order of the cluster's endpoints): the index in
    /// `names` of its certificate name, `None` for an http worker.
    pub endpoint_names: Vec<Option<usize>>,
}

impl WorkerTlsPlan {
    /// Envoy's TLS to the workers of `members`: `None` when none is `https://`. Errors, naming
    /// the workers, when no CA file is known: Envoy has no default trust store and would verify
    /// nothing.
    pub fn from_config(
        config: &Config,
        members: &[Member],
        args: &EnvoyWorkerTlsArgs,
    ) -> anyhow::Result<Option<Self>> {
        let https: Vec<&Member> = members.iter().filter(|m| m.url.is_https()).collect();
        if https.is_empty() {
            return Ok(None);
        }
        let mut names: Vec<WorkerCertificateName> = Vec::new();
        let endpoint_names = members
            .iter()
            .map(|member| {
                member.url.is_https().then(|| {
                    let name = certificate_name(member);
                    names.iter().position(|n| *n == name).unwrap_or_else(|| {
                        names.push(name);
                        names.len() - 1
                    })
                })
            })
            .collect();
        let upstream = &config.upstream.tls;
        let Some(ca_file) = args
            .worker_ca_file
            .clone()
            .or_else(|| upstream.ca_file().map(Path::to_path_buf))
        else {
            bail!(
                "https workers ({}) behind Envoy need a CA file: Envoy has no default trust store and would verify nothing; set [upstream.tls] ca_file (the system roots are e.g. /etc/ssl/certs/ca-certificates.crt) or give --worker-ca-file",
                https
                    .iter()
                    .map(|m| m.spec.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        let client = args
            .worker_client_cert_file
            .clone()
            .zip(args.worker_client_key_file.clone())
            .or_else(|| {
                upstream
                    .client_identity()
                    .map(|(cert, key)| (cert.to_path_buf(), key.to_path_buf()))
            });
        Ok(Some(Self {
            ca_file,
            client,
            names,
            endpoint_names,
        }))
    }
}

impl WorkerCertificateName {
    fn as_str(&self) -> &str {
        match self {
            Self::Dns(name) | Self::Ip(name) => name,
        }
    }
}

/// The name `member`'s certificate is checked against: its `server_name`, else its URL's host.
fn certificate_name(member: &Member) -> WorkerCertificateName {
    match &member.server_name {
        Some(ServerName::DnsName(name)) => WorkerCertificateName::Dns(name.as_ref().to_owned()),
        Some(ServerName::IpAddress(ip)) => {
            WorkerCertificateName::Ip(std::net::IpAddr::from(*ip).to_string())
        }
        // An https member always has a name; the URL's host is the same fallback.
        _ => WorkerCertificateName::Ip(
            member
                .url
                .authority
                .host()
                .trim_matches(['[', ']'])
                .to_owned(),
        ),
    }
}

/// The metadata of an https endpoint (indented for an entry of `lb_endpoints`) that selects its
/// name's entry `index` of the cluster's `transport_socket_matches`.
pub fn endpoint_metadata(yaml: &mut String, index: usize) {
    let _ = writeln!(
        yaml,
        "          metadata:\n            filter_metadata:\n              envoy.transport_socket_match: {{ {WORKER_TLS_MATCH_KEY}: \"{index}\" }}"
    );
}

/// The `transport_socket_matches` of the workers' cluster (indented for a cluster in
/// `static_resources.clusters`), one entry per certificate name: TLS 1.2 or 1.3 with ALPN
/// `http/1.1` (how Envoy speaks to workers), the certificate verified against the CA and that
/// name, and Envoy's client certificate when there is one. An endpoint without the metadata (an
/// http worker) matches none and is plain.
pub fn workers_transport_socket_matches(yaml: &mut String, tls: &WorkerTlsPlan) {
    yaml.push_str(
        "    # The https workers: Envoy verifies each one's certificate (CA and the worker's own\n\
         \x20   # name, selected by the endpoint's metadata) and, for workers that require one,\n\
         \x20   # presents its client certificate ([upstream.tls]). http workers match no entry.\n\
         \x20   transport_socket_matches:\n",
    );
    for (index, name) in tls.names.iter().enumerate() {
        let _ = write!(
            yaml,
            "    - name: {}\n      match: {{ {WORKER_TLS_MATCH_KEY}: \"{index}\" }}\n",
            quoted(&format!("tls {}", name.as_str()))
        );
        worker_transport_socket(yaml, tls, name);
    }
}

fn worker_transport_socket(yaml: &mut String, tls: &WorkerTlsPlan, name: &WorkerCertificateName) {
    yaml.push_str(
        "      transport_socket:\n\
         \x20       name: envoy.transport_sockets.tls\n\
         \x20       typed_config:\n\
         \x20         \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n",
    );
    if let WorkerCertificateName::Dns(name) = name {
        let _ = writeln!(yaml, "          sni: {}", quoted(name));
    }
    // Envoy's upstream default is TLS 1.2 at most: 1.3 is allowed explicitly.
    yaml.push_str(
        "          common_tls_context:\n\
         \x20           alpn_protocols: [\"http/1.1\"]\n\
         \x20           tls_params:\n\
         \x20             tls_minimum_protocol_version: TLSv1_2\n\
         \x20             tls_maximum_protocol_version: TLSv1_3\n",
    );
    if let Some((cert, key)) = &tls.client {
        let _ = write!(
            yaml,
            "            tls_certificates:\n            - certificate_chain: {{ filename: {} }}\n              private_key: {{ filename: {} }}\n",
            quoted_path(cert),
            quoted_path(key)
        );
    }
    let san_type = match name {
        WorkerCertificateName::Dns(_) => "DNS",
        WorkerCertificateName::Ip(_) => "IP_ADDRESS",
    };
    let _ = write!(
        yaml,
        "            validation_context:\n              trusted_ca: {{ filename: {} }}\n              match_typed_subject_alt_names:\n              - san_type: {san_type}\n                matcher: {{ exact: {} }}\n",
        quoted_path(&tls.ca_file),
        quoted(name.as_str())
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;

    fn config(workers: &[(&str, Option<&str>)], ca: &str) -> Config {
        let mut config = Config::default();
        config.upstream.tls.ca_file = ca.into();
        config.workers = workers
            .iter()
            .map(|(url, name)| WorkerConfig {
                server_name: name.map(str::to_owned),
                ..WorkerConfig::from_url(url)
            })
            .collect();
        config
    }

    fn plan(config: &Config, args: &EnvoyWorkerTlsArgs) -> anyhow::Result<Option<WorkerTlsPlan>> {
        WorkerTlsPlan::from_config(config, &config.members()?, args)
    }

    fn matches(tls: &WorkerTlsPlan) -> String {
        let mut yaml = String::new();
        workers_transport_socket_matches(&mut yaml, tls);
        yaml
    }

    #[test]
    fn plain_workers_need_no_tls() {
        let config = config(&[("http://10.0.0.1:8000", None)], "");
        assert_eq!(plan(&config, &EnvoyWorkerTlsArgs::default()).unwrap(), None);
    }

    #[test]
    fn https_workers_sharing_a_server_name_share_one_entry_and_the_upstream_files() {
        let mut config = config(
            &[
                ("https://10.0.0.1:8443", Some("workers.bch.svc")),
                ("https://10.0.0.2:8443", Some("workers.bch.svc")),
            ],
            "/etc/bch/workers-ca.crt",
        );
        config.upstream.tls.client_cert_file = "/etc/bch/client.crt".into();
        config.upstream.tls.client_key_file = "/etc/bch/client.key".into();
        let tls = plan(&config, &EnvoyWorkerTlsArgs::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            tls.names,
            [WorkerCertificateName::Dns("workers.bch.svc".into())]
        );
        assert_eq!(tls.endpoint_names, [Some(0), Some(0)]);
        let yaml = matches(&tls);
        for line in [
            "    - name: \"tls workers.bch.svc\"\n      match: { bch_worker_tls: \"0\" }\n",
            "          sni: \"workers.bch.svc\"\n",
            "            alpn_protocols: [\"http/1.1\"]\n",
            "              tls_maximum_protocol_version: TLSv1_3\n",
            "            - certificate_chain: { filename: \"/etc/bch/client.crt\" }\n",
            "              private_key: { filename: \"/etc/bch/client.key\" }\n",
            "              trusted_ca: { filename: \"/etc/bch/workers-ca.crt\" }\n",
            "              - san_type: DNS\n                matcher: { exact: \"workers.bch.svc\" }\n",
        ] {
            assert!(yaml.contains(line), "{line} in {yaml}");
        }
        assert_eq!(yaml.matches("transport_socket:").count(), 1, "{yaml}");

        let args = EnvoyWorkerTlsArgs {
            worker_ca_file: Some("/etc/envoy/ca.crt".into()),
            worker_client_cert_file: Some("/etc/envoy/envoy.crt".into()),
            worker_client_key_file: Some("/etc/envoy/envoy.key".into()),
        };
        let tls = plan(&config, &args).unwrap().unwrap();
        assert_eq!(tls.ca_file, PathBuf::from("/etc/envoy/ca.crt"));
        assert_eq!(
            tls.client,
            Some(("/etc/envoy/envoy.crt".into(), "/etc/envoy/envoy.key".into()))
        );
    }

    /// Workers addressed by IP are each checked against their own name: their server_name (SNI
    /// and DNS SAN), else their own IP (IP SAN, no SNI). One shared name for the whole cluster
    /// made Envoy check every worker against the first one's name, so `envoy-config` refused
    /// such fleets.
    #[test]
    fn each_https_worker_is_checked_against_its_own_name_and_http_workers_stay_plain() {
        let config = config(
            &[
                ("https://127.0.0.1:8441", Some("w0.bch.test")),
                ("https://127.0.0.1:8442", Some("w1.bch.test")),
                ("http://10.0.0.3:8000", None),
                ("https://10.0.0.4:8443", None),
                ("https://10.0.0.5:8443", Some("w0.bch.test")),
            ],
            "ca.crt",
        );
        let tls = plan(&config, &EnvoyWorkerTlsArgs::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            tls.names,
            [
                WorkerCertificateName::Dns("w0.bch.test".into()),
                WorkerCertificateName::Dns("w1.bch.test".into()),
                WorkerCertificateName::Ip("10.0.0.4".into()),
            ]
        );
        assert_eq!(
            tls.endpoint_names,
            [Some(0), Some(1), None, Some(2), Some(0)]
        );
        let yaml = matches(&tls);
        for line in [
            "      match: { bch_worker_tls: \"1\" }\n      transport_socket:\n",
            "          sni: \"w1.bch.test\"\n",
            "              - san_type: DNS\n                matcher: { exact: \"w1.bch.test\" }\n",
            "    - name: \"tls 10.0.0.4\"\n      match: { bch_worker_tls: \"2\" }\n",
            "              - san_type: IP_ADDRESS\n                matcher: { exact: \"10.0.0.4\" }\n",
        ] {
            assert!(yaml.contains(line), "{line} in {yaml}");
        }
        assert_eq!(yaml.matches("sni:").count(), 2, "no SNI for an IP: {yaml}");
        assert!(!yaml.contains("tls_certificates"), "{yaml}");
        let mut metadata = String::new();
        endpoint_metadata(&mut metadata, 2);
        assert_eq!(
            metadata,
            "          metadata:\n            filter_metadata:\n              envoy.transport_socket_match: { bch_worker_tls: \"2\" }\n"
        );
    }

    #[test]
    fn https_workers_without_a_ca_file_are_refused_by_name() {
        let no_ca = config(&[("https://10.0.0.1:8443", Some("w.bch.svc"))], "");
        let error = plan(&no_ca, &EnvoyWorkerTlsArgs::default()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("https workers (10.0.0.1:8443) behind Envoy need a CA file"),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("Envoy has no default trust store"),
            "{error}"
        );
        assert!(error.to_string().contains("--worker-ca-file"), "{error}");
    }
}
