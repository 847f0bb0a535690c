//! `gatewayd check-config`'s TLS findings (the same checks refuse a start): unreadable and
//! swapped files and a key that does not match are errors; an expired certificate, one expiring
//! within 14 days, and a picker beyond loopback without mutual TLS are warnings.

use gatewayd::config::Config;

use super::*;

fn base() -> Config {
    let mut config = Config::default();
    config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
    config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
    config.workers = vec![gatewayd::config::WorkerConfig {
        name: None,
        url: "http://127.0.0.1:1".to_owned(),
        ring_id: None,
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    }];
    config
}

fn findings(config: Config) -> gatewayd::Findings {
    gatewayd::check(&gatewayd::StartOptions::new(config))
}

#[tokio::test]
async fn unreadable_swapped_and_mismatched_files_are_errors_that_refuse_a_start() {
    let pki = Pki::generate();
    let (cert, _) = leaf(pki.ca(), 7, None);
    let (_, other_key) = leaf(pki.ca(), 8, None);
    pki.write("mismatched.crt", &cert);
    pki.write("other.key", &other_key);

    let mut config = base();
    config.server.tls = Some(ListenerTls {
        cert_file: pki.path("absent.crt"),
        ..pki.listener(false)
    });
    config.control.tls = Some(ListenerTls {
        cert_file: pki.path("mismatched.crt"),
        key_file: pki.path("other.key"),
        client_ca_file: pki.path("server.key"),
    });
    let found = findings(config.clone());
    assert_eq!(found.errors.len(), 2, "{:#?}", found.errors);
    assert!(
        found.errors[0].starts_with("server.tls: certificate file")
            && found.errors[0].contains("absent.crt"),
        "{:#?}",
        found.errors
    );
    // The CA file holds a key, not a certificate: named before the key pair is checked.
    assert!(
        found.errors[1].starts_with("control.tls: CA file")
            && found.errors[1].contains("server.key"),
        "{:#?}",
        found.errors
    );
    config.control.tls.as_mut().unwrap().client_ca_file = pki.path("ca.crt");
    let found = findings(config.clone());
    assert!(
        found.errors[1].contains("the private key does not match the certificate"),
        "{:#?}",
        found.errors
    );
    let refused = gatewayd::start(gatewayd::StartOptions::new(config)).await;
    let message = refused.err().expect("refused").to_string();
    assert!(message.contains("absent.crt"), "{message}");
}

#[test]
fn expired_and_expiring_certificates_and_an_open_picker_are_warnings() {
    let pki = Pki::generate();
    pki.write_server(&leaf(pki.ca(), 9, Some(now_unix() - 86_400)));
    let (cert, key) = leaf(pki.ca(), 10, Some(now_unix() + 3 * 86_400));
    pki.write("soon.crt", &cert);
    pki.write("soon.key", &key);
    let mut config = base();
    config.server.tls = Some(pki.listener(false));
    config.picker.listen = Some("0.0.0.0:0".parse().unwrap());
    config.picker.tls = Some(ListenerTls {
        cert_file: pki.path("soon.crt"),
        key_file: pki.path("soon.key"),
        client_ca_file: PathBuf::new(),
    });
    let found = findings(config.clone());
    assert!(found.errors.is_empty(), "{:#?}", found.errors);
    let warnings = found.warnings.join("\n");
    assert_eq!(
        warnings.matches("server.tls").count(),
        1,
        "one warning for a certificate two listeners serve: {warnings}"
    );
    assert!(
        warnings.contains("server.tls: certificate") && warnings.contains("expired"),
        "{warnings}"
    );
    assert!(
        warnings.contains("picker.tls: certificate") && warnings.contains("expires in "),
        "{warnings}"
    );
    assert!(
        warnings.contains("beyond loopback without mutual TLS"),
        "{warnings}"
    );
    // With the CA's mutual TLS, the open picker is no longer warned about.
    config.picker.tls.as_mut().unwrap().client_ca_file = pki.path("ca.crt");
    let warnings = findings(config).warnings.join("\n");
    assert!(!warnings.contains("loopback"), "{warnings}");
}
