//! The TLS half of `gatewayd envoy-config`: when the picker speaks TLS (`[picker.tls]`, or
//! `[server.tls]` it inherits), Envoy's gRPC cluster to it gets an upstream TLS transport socket
//! that verifies gatewayd's certificate and, when the picker requires client certificates,
//! presents Envoy's own. The files are Envoy's, named by flags (gatewayd never reads them: they
//! live where Envoy runs). docs/envoy.md "The picker over TLS" explains the choices.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;

use crate::config::{Config, TlsListener};

/// Envoy's side of the picker's TLS: the files Envoy reads, as paths on Envoy's host.
#[derive(Debug, Clone, Default, Args)]
pub struct EnvoyPickerTlsArgs {
    /// CA certificates (PEM) Envoy trusts for the picker's certificate; required when the
    /// picker speaks TLS.
    #[arg(long, value_name = "FILE")]
    pub picker_ca_file: Option<PathBuf>,
    /// Envoy's client certificate chain (PEM) for the picker; required when the picker asks
    /// for client certificates ([picker.tls] client_ca_file).
    #[arg(long, value_name = "FILE", requires = "picker_client_key_file")]
    pub picker_client_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --picker-client-cert-file.
    #[arg(long, value_name = "FILE", requires = "picker_client_cert_file")]
    pub picker_client_key_file: Option<PathBuf>,
    /// The name Envoy sends as SNI and requires among the picker certificate's DNS names;
    /// without it the certificate must name the picker's IP address.
    #[arg(long, value_name = "NAME")]
    pub picker_server_name: Option<String>,
}

/// How Envoy reaches a TLS picker, checked against gatewayd's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickerTlsPlan {
    /// The CA file Envoy verifies the picker's certificate with.
    pub ca_file: PathBuf,
    /// Envoy's client certificate and key, when the picker requires one.
    pub client: Option<(PathBuf, PathBuf)>,
    /// SNI and the DNS name required in the picker's certificate; `None` = its IP address.
    pub server_name: Option<String>,
}

impl PickerTlsPlan {
    /// Envoy's TLS to the picker for `config`: `None` when the picker is plain. Errors when the
    /// picker speaks TLS without `--picker-ca-file` (Envoy would verify nothing), when it
    /// requires client certificates and Envoy has none, or when TLS files are given for a plain
    /// picker (a bootstrap that cannot connect).
    pub fn from_config(config: &Config, args: &EnvoyPickerTlsArgs) -> anyhow::Result<Option<Self>> {
        let client = args
            .picker_client_cert_file
            .clone()
            .zip(args.picker_client_key_file.clone());
        let Some((tls, inherited)) = config.listener_tls(TlsListener::Picker) else {
            if args.picker_ca_file.is_some() || client.is_some() {
                bail!(
                    "--picker-ca-file / --picker-client-cert-file are given but the picker is plain (no [picker.tls] or [server.tls])"
                );
            }
            return Ok(None);
        };
        let section = TlsListener::Picker.section(inherited);
        let Some(ca_file) = args.picker_ca_file.clone() else {
            bail!(
                "the picker speaks TLS ([{section}]): give --picker-ca-file, the CA Envoy verifies its certificate with"
            );
        };
        if tls.client_ca().is_some() && client.is_none() {
            bail!(
                "the picker requires client certificates ([{section}] client_ca_file): give --picker-client-cert-file and --picker-client-key-file, Envoy's certificate"
            );
        }
        Ok(Some(Self {
            ca_file,
            client,
            server_name: args.picker_server_name.clone(),
        }))
    }
}

/// The `transport_socket` of the picker's cluster (indented for a cluster in
/// `static_resources.clusters`): TLS 1.2 or 1.3 with ALPN `h2`, gatewayd's certificate verified
/// against the CA and its name (the server name's DNS SAN, else the picker's IP SAN), and Envoy's
/// client certificate when there is one.
pub fn picker_transport_socket(yaml: &mut String, tls: &PickerTlsPlan, picker: SocketAddr) {
    yaml.push_str(
        "    # gatewayd's picker speaks TLS: Envoy verifies its certificate (CA and name) and,\n\
         \x20   # when the picker requires one, presents its own client certificate.\n\
         \x20   transport_socket:\n\
         \x20     name: envoy.transport_sockets.tls\n\
         \x20     typed_config:\n\
         \x20       \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n",
    );
    if let Some(name) = &tls.server_name {
        let _ = writeln!(yaml, "        sni: {}", quoted(name));
    }
    // Envoy's upstream default is TLS 1.2 at most: 1.3 is allowed explicitly.
    yaml.push_str(
        "        common_tls_context:\n\
         \x20         alpn_protocols: [h2]\n\
         \x20         tls_params:\n\
         \x20           tls_minimum_protocol_version: TLSv1_2\n\
         \x20           tls_maximum_protocol_version: TLSv1_3\n",
    );
    if let Some((cert, key)) = &tls.client {
        let _ = write!(
            yaml,
            "          tls_certificates:\n          - certificate_chain: {{ filename: {} }}\n            private_key: {{ filename: {} }}\n",
            quoted_path(cert),
            quoted_path(key)
        );
    }
    let (san_type, name) = match &tls.server_name {
        Some(name) => ("DNS", name.clone()),
        None => ("IP_ADDRESS", picker.ip().to_string()),
    };
    let _ = write!(
        yaml,
        "          validation_context:\n            trusted_ca: {{ filename: {} }}\n            match_typed_subject_alt_names:\n            - san_type: {san_type}\n              matcher: {{ exact: {} }}\n",
        quoted_path(&tls.ca_file),
        quoted(&name)
    );
}

/// A double-quoted YAML scalar.
pub(super) fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A path as a double-quoted YAML scalar.
pub(super) fn quoted_path(path: &Path) -> String {
    quoted(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ListenerTls;

    fn picker_tls(client_ca: &str) -> Config {
        let mut config = Config::default();
        config.picker.tls = Some(ListenerTls {
            cert_file: "picker.crt".into(),
            key_file: "picker.key".into(),
            client_ca_file: client_ca.into(),
        });
        config
    }

    fn args(ca: Option<&str>, client: Option<(&str, &str)>) -> EnvoyPickerTlsArgs {
        EnvoyPickerTlsArgs {
            picker_ca_file: ca.map(PathBuf::from),
            picker_client_cert_file: client.map(|(c, _)| c.into()),
            picker_client_key_file: client.map(|(_, k)| k.into()),
            picker_server_name: None,
        }
    }

    #[test]
    fn a_plain_picker_needs_no_tls_and_refuses_tls_files() {
        let config = Config::default();
        assert_eq!(
            PickerTlsPlan::from_config(&config, &args(None, None)).unwrap(),
            None
        );
        let error = PickerTlsPlan::from_config(&config, &args(Some("ca.pem"), None)).unwrap_err();
        assert!(error.to_string().contains("the picker is plain"), "{error}");
    }

    #[test]
    fn a_tls_picker_needs_envoys_ca_and_with_mutual_tls_its_certificate() {
        let error = PickerTlsPlan::from_config(&picker_tls(""), &args(None, None)).unwrap_err();
        assert!(error.to_string().contains("--picker-ca-file"), "{error}");
        let error = PickerTlsPlan::from_config(&picker_tls("ca.pem"), &args(Some("ca.pem"), None))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("[picker.tls] client_ca_file): give --picker-client-cert-file"),
            "{error}"
        );
        let mut inherited = Config::default();
        inherited.server.tls = picker_tls("ca.pem").picker.tls;
        let error = PickerTlsPlan::from_config(&inherited, &args(None, None)).unwrap_err();
        assert!(error.to_string().contains("[server.tls]"), "{error}");
    }

    #[test]
    fn the_transport_socket_verifies_the_picker_and_presents_envoys_certificate() {
        let plan = PickerTlsPlan::from_config(
            &picker_tls("ca.pem"),
            &args(
                Some("/etc/envoy/bch-ca.pem"),
                Some(("/etc/envoy/envoy.crt", "/etc/envoy/envoy.key")),
            ),
        )
        .unwrap()
        .unwrap();
        let mut yaml = String::new();
        picker_transport_socket(&mut yaml, &plan, "10.0.0.7:9002".parse().unwrap());
        for line in [
            "      name: envoy.transport_sockets.tls\n",
            "          alpn_protocols: [h2]\n",
            "            tls_maximum_protocol_version: TLSv1_3\n",
            "          - certificate_chain: { filename: \"/etc/envoy/envoy.crt\" }\n",
            "            private_key: { filename: \"/etc/envoy/envoy.key\" }\n",
            "            trusted_ca: { filename: \"/etc/envoy/bch-ca.pem\" }\n",
            "            - san_type: IP_ADDRESS\n              matcher: { exact: \"10.0.0.7\" }\n",
        ] {
            assert!(yaml.contains(line), "{line} in {yaml}");
        }
        assert!(!yaml.contains("sni:"));

        let named = PickerTlsPlan {
            server_name: Some("picker.bch.svc".into()),
            client: None,
            ..plan
        };
        let mut yaml = String::new();
        picker_transport_socket(&mut yaml, &named, "10.0.0.7:9002".parse().unwrap());
        assert!(yaml.contains("        sni: \"picker.bch.svc\"\n"), "{yaml}");
        assert!(
            yaml.contains(
                "- san_type: DNS\n              matcher: { exact: \"picker.bch.svc\" }\n"
            )
        );
        assert!(!yaml.contains("tls_certificates"), "{yaml}");
    }
}
