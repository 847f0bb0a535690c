//! Certificates for tests, made with rcgen and written as PEM files to a temporary directory: a
//! CA ([`Authority`]), the server and client certificates it signs, another CA's (a rogue
//! certificate nobody trusts), and expired ones. Every test of a TLS client or server in the
//! workspace makes its certificates here, so each verifies against a real chain: verification is
//! never turned off.
//!
//! ```
//! use bch_tls::test_pki::{Authority, Pki};
//!
//! let pki = Pki::new("bch test CA");
//! let server = pki.issue("server", &["localhost", "127.0.0.1"]);
//! let rogue = pki.issue_by("rogue", &Authority::new("rogue CA"), &["localhost"], |_| {});
//! let expired = pki.issue_by("expired", pki.ca(), &["localhost"], bch_tls::test_pki::expired);
//! assert!(server.cert.exists() && rogue.key.exists() && expired.cert.exists());
//! ```

use std::path::{Path, PathBuf};

pub use rcgen;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority: signs server and client certificates.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
pub struct Signed {
    /// The certificate, PEM.
    pub cert: String,
    /// Its private key (PKCS#8), PEM.
    pub key: String,
}

impl Authority {
    /// A new self-signed CA whose common name is `name`, with its own ECDSA P-256 key.
    pub fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names to check");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("an ECDSA P-256 key");
        Authority {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a self-signed CA"),
        }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses; empty for a client certificate)
    /// with a new key, signed by this CA after `adjust` changed its parameters (validity,
    /// serial, key usages, a common name). Valid from now to the year 4096 unless adjusted.
    pub fn sign(&self, names: &[&str], adjust: impl FnOnce(&mut CertificateParams)) -> Signed {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("valid subject names");
        adjust(&mut params);
        let key = KeyPair::generate().expect("an ECDSA P-256 key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("the CA signs a leaf");
        Signed {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Makes a certificate valid only in 2020: expired now. For [`Authority::sign`]'s `adjust`.
pub fn expired(params: &mut CertificateParams) {
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 12, 31);
}

/// A certificate file and its key file.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The certificate, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
}

/// A CA and the certificates it signs, as PEM files in a temporary directory (removed on drop).
/// The CA's certificate is `ca.crt`; a certificate issued as `stem` is `{stem}.crt` and
/// `{stem}.key`.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: Authority,
}

impl Pki {
    /// A new CA whose common name is `name`, its certificate written to `ca.crt`.
    pub fn new(name: &str) -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().expect("a temporary directory"),
            ca: Authority::new(name),
        };
        pki.write("ca.crt", &pki.ca.pem());
        pki
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file called `name` in [`Pki::dir`].
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA.
    pub fn ca(&self) -> &Authority {
        &self.ca
    }

    /// The CA's certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// A certificate for `names` signed by the CA, written as `{stem}.crt` and `{stem}.key`.
    pub fn issue(&self, stem: &str, names: &[&str]) -> Identity {
        self.issue_by(stem, &self.ca, names, |_| {})
    }

    /// A certificate for `names` signed by `authority` (this CA or another) after `adjust`
    /// (see [`Authority::sign`]), written as `{stem}.crt` and `{stem}.key`.
    pub fn issue_by(
        &self,
        stem: &str,
        authority: &Authority,
        names: &[&str],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Identity {
        self.write_identity(stem, &authority.sign(names, adjust))
    }

    /// Writes `signed` as `{stem}.crt` and `{stem}.key`.
    pub fn write_identity(&self, stem: &str, signed: &Signed) -> Identity {
        Identity {
            cert: self.write(&format!("{stem}.crt"), &signed.cert),
            key: self.write(&format!("{stem}.key"), &signed.key),
        }
    }

    /// Writes `text` as the file called `name` and answers its path. Written whole then renamed,
    /// as cert-manager's atomic writer does: a reader (a gateway reloading) never sees half a
    /// file.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        let temporary = self.path(&format!("{name}.new"));
        std::fs::write(&temporary, text).expect("write a test certificate file");
        std::fs::rename(&temporary, &path).expect("rename a test certificate file");
        path
    }
}
