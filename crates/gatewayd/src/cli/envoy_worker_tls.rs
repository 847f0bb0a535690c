//! The workers' half of `gatewayd envoy-config`'s TLS: in picker mode Envoy, not gatewayd, carries
//! the requests, so `https://` workers need an upstream TLS transport socket on Envoy's worker
//! cluster, made from the same `[upstream.tls]` settings gatewayd's prober and scraper use (flags
//! may name Envoy's own copies of the files). One cluster has one transport socket: the https
//! workers must share one name to verify, and cannot be mixed with plain ones. docs/envoy.md
//! "https workers behind Envoy" explains the choices.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;
use rustls_pki_types::ServerName;

use super::envoy_tls::{quoted, quoted_path};
use crate::config::{Config, Member};

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

/// The name Envoy checks in every worker's certificate.
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
    /// The one name every worker's certificate must carry.
    pub name: WorkerCertificateName,
}

impl WorkerTlsPlan {
    /// Envoy's TLS to the workers of `members`: `None` when none is `https://`. Errors, naming
    /// the workers, when http and https workers are mixed or the https workers' names differ
    /// (one cluster has one transport socket), and when no CA file is known: Envoy has no
    /// default trust store and would verify nothing.
    pub fn from_config(
        config: &Config,
        members: &[Member],
        args: &EnvoyWorkerTlsArgs,
    ) -> anyhow::Result<Option<Self>> {
        let (https, plain): (Vec<&Member>, Vec<&Member>) =
            members.iter().partition(|m| m.url.is_https());
        if https.is_empty() {
            return Ok(None);
        }
        if !plain.is_empty() {
            bail!(
                "Envoy's worker cluster has one transport socket, so its workers must be all http:// or all https://: https: {}; http: {}",
                names(&https),
                names(&plain)
            );
        }
        let mut named: Vec<(WorkerCertificateName, Vec<&Member>)> = Vec::new();
        for member in &https {
            let name = certificate_name(member);
            match named.iter_mut().find(|(n, _)| *n == name) {
                Some((_, workers)) => workers.push(member),
                None => named.push((name, vec![member])),
            }
        }
        if named.len() > 1 {
            let groups = named
                .iter()
                .map(|(name, workers)| format!("{} ({})", name.as_str(), names(workers)))
                .collect::<Vec<_>>()
                .join("; ");
            bail!(
                "Envoy checks one certificate name for all https workers, and these differ: {groups}; give the workers one server_name their certificates share"
            );
        }
        let upstream = &config.upstream.tls;
        let Some(ca_file) = args
            .worker_ca_file
            .clone()
            .or_else(|| upstream.ca_file().map(Path::to_path_buf))
        else {
            bail!(
                "https workers ({}) behind Envoy need a CA file: Envoy has no default trust store and would verify nothing; set [upstream.tls] ca_file (the system roots are e.g. /etc/ssl/certs/ca-certificates.crt) or give --worker-ca-file",
                names(&https)
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
        let name = named.remove(0).0;
        Ok(Some(Self {
            ca_file,
            client,
            name,
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

fn names(members: &[&Member]) -> String {
    members
        .iter()
        .map(|m| m.spec.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `transport_socket` of the workers' cluster (indented for a cluster in
/// `static_resources.clusters`): TLS 1.2 or 1.3 with ALPN `http/1.1` (how Envoy speaks to
/// workers), each worker's certificate verified against the CA and the shared name, and Envoy's
/// client certificate when there is one.
pub fn workers_transport_socket(yaml: &mut String, tls: &WorkerTlsPlan) {
    yaml.push_str(
        "    # The workers are https://: Envoy verifies their certificates (CA and name) and, for\n\
         \x20   # workers that require one, presents its client certificate ([upstream.tls]).\n\
         \x20   transport_socket:\n\
         \x20     name: envoy.transport_sockets.tls\n\
         \x20     typed_config:\n\
         \x20       \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n",
    );
    if let WorkerCertificateName::Dns(name) = &tls.name {
        let _ = writeln!(yaml, "        sni: {}", quoted(name));
    }
    yaml.push_str(
        "        common_tls_context:\n\
         \x20         alpn_protocols: [\"http/1.1\"]\n\
         \x20         tls_params:\n\
         \x20           tls_minimum_protocol_version: TLSv1_2\n",
    );
    if let Some((cert, key)) = &tls.client {
        let _ = write!(
            yaml,
            "          tls_certificates:\n          - certificate_chain: {{ filename: {} }}\n            private_key: {{ filename: {} }}\n",
            quoted_path(cert),
            quoted_path(key)
        );
    }
    let san_type = match tls.name {
        WorkerCertificateName::Dns(_) => "DNS",
        WorkerCertificateName::Ip(_) => "IP_ADDRESS",
    };
    let _ = write!(
        yaml,
        "          validation_context:\n            trusted_ca: {{ filename: {} }}\n            match_typed_subject_alt_names:\n            - san_type: {san_type}\n              matcher: {{ exact: {} }}\n",
        quoted_path(&tls.ca_file),
        quoted(tls.name.as_str())
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

    #[test]
    fn plain_workers_need_no_tls() {
        let config = config(&[("http://10.0.0.1:8000", None)], "");
        assert_eq!(plan(&config, &EnvoyWorkerTlsArgs::default()).unwrap(), None);
    }

    #[test]
    fn https_workers_share_their_server_name_and_the_upstream_files() {
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
        let mut yaml = String::new();
        workers_transport_socket(&mut yaml, &tls);
        for line in [
            "        sni: \"workers.bch.svc\"\n",
            "          alpn_protocols: [\"http/1.1\"]\n",
            "          - certificate_chain: { filename: \"/etc/bch/client.crt\" }\n",
            "            private_key: { filename: \"/etc/bch/client.key\" }\n",
            "            trusted_ca: { filename: \"/etc/bch/workers-ca.crt\" }\n",
            "            - san_type: DNS\n              matcher: { exact: \"workers.bch.svc\" }\n",
        ] {
            assert!(yaml.contains(line), "{line} in {yaml}");
        }

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

    #[test]
    fn one_https_worker_by_ip_is_checked_by_its_ip_without_sni_or_client_certificate() {
        let config = config(&[("https://10.0.0.1:8443", None)], "ca.crt");
        let tls = plan(&config, &EnvoyWorkerTlsArgs::default())
            .unwrap()
            .unwrap();
        assert_eq!(tls.name, WorkerCertificateName::Ip("10.0.0.1".into()));
        let mut yaml = String::new();
        workers_transport_socket(&mut yaml, &tls);
        assert!(
            yaml.contains(
                "- san_type: IP_ADDRESS\n              matcher: { exact: \"10.0.0.1\" }\n"
            ),
            "{yaml}"
        );
        assert!(!yaml.contains("sni:"), "{yaml}");
        assert!(!yaml.contains("tls_certificates"), "{yaml}");
    }

    #[test]
    fn mixed_schemes_different_names_and_no_ca_are_refused_by_name() {
        let mixed = config(
            &[
                ("https://10.0.0.1:8443", None),
                ("http://10.0.0.2:8000", None),
            ],
            "ca.crt",
        );
        let error = plan(&mixed, &EnvoyWorkerTlsArgs::default()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("all http:// or all https://: https: 10.0.0.1:8443; http: 10.0.0.2:8000"),
            "{error}"
        );

        let two_names = config(
            &[
                ("https://10.0.0.1:8443", None),
                ("https://10.0.0.2:8443", None),
            ],
            "ca.crt",
        );
        let error = plan(&two_names, &EnvoyWorkerTlsArgs::default()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("these differ: 10.0.0.1 (10.0.0.1:8443); 10.0.0.2 (10.0.0.2:8443)"),
            "{error}"
        );

        let no_ca = config(&[("https://10.0.0.1:8443", Some("w.bch.svc"))], "");
        let error = plan(&no_ca, &EnvoyWorkerTlsArgs::default()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("Envoy has no default trust store"),
            "{error}"
        );
        assert!(error.to_string().contains("--worker-ca-file"), "{error}");
    }
}
