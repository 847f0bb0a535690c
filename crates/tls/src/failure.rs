//! A failed handshake in words an operator acts on ("server certificate not trusted", "name
//! mismatch", "expired", "the server refused the client certificate") instead of a generic
//! connection error, whichever client (reqwest, tokio-rustls, tokio-tungstenite) it came from.

/// What went wrong in TLS, as [`describe`] says it, when `error` or one of its causes is a TLS
/// failure; `None` for any other failure.
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    find_rustls(error).map(describe)
}

/// One rustls error as `TLS: <what> (<rustls' words>)`; `<what>` names the flag to check
/// (`--ca-file`, `--client-cert`) where one would fix it.
pub fn describe(error: &rustls::Error) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    let what = match error {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "server certificate not trusted (check --ca-file)",
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "server certificate name mismatch",
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "server certificate expired",
        Error::InvalidCertificate(_) => "server certificate invalid",
        Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            // A client certificate whose signature does not verify against the server's CA.
            | AlertDescription::DecryptError
            | AlertDescription::AccessDenied,
        ) => "the server refused the client certificate (check --client-cert)",
        _ => "handshake failed",
    };
    format!("TLS: {what} ({error})")
}

/// The rustls error in `error` or its causes. Looks inside I/O errors, whose `source` skips what
/// they wrap (tokio-rustls hands a failed handshake over as one).
fn find_rustls<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner: Option<&(dyn std::error::Error + 'static)> = error
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .map(|inner| inner as _);
    inner
        .and_then(find_rustls)
        .or_else(|| error.source().and_then(find_rustls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{AlertDescription, CertificateError, Error};

    #[test]
    fn a_rustls_error_inside_an_io_error_is_found_and_named() {
        let io = std::io::Error::other(Error::InvalidCertificate(CertificateError::UnknownIssuer));
        let words = tls_failure(&io).expect("a TLS failure");
        assert!(
            words.starts_with("TLS: server certificate not trusted (check --ca-file)"),
            "{words}"
        );
        let refused = describe(&Error::AlertReceived(AlertDescription::CertificateRequired));
        assert!(
            refused.starts_with("TLS: the server refused the client certificate"),
            "{refused}"
        );
        assert_eq!(tls_failure(&std::io::Error::other("reset")), None);
    }
}
