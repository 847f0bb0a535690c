//! One worker as configured (`[[workers]]`, `--worker URL`, `POST /admin/workers`) and as parsed:
//! its entry is validated once, here, into a [`Member`] whose URL (checked and split by `url`)
//! is carried parsed from then on, so nothing on the data path or in the health prober parses it
//! again.

use bch_core::router::{WorkerSource, WorkerSpec};
use rustls_pki_types::ServerName;
use serde::{Deserialize, Serialize};

pub use url::{WorkerUrl, WorkerUrlError};

use super::field_error::FieldError;

mod url;

/// One `[[workers]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Unique name; defaults to the URL's `host:port`.
    #[serde(default)]
    pub name: Option<String>,
    /// Base URL, `http://host:port` or `https://host:port`, with an optional path prefix.
    pub url: String,
    /// Ring identity; defaults to the URL exactly as written (SGLang Model Gateway parity).
    #[serde(default)]
    pub ring_id: Option<String>,
    /// Health probe path for this worker (llama.cpp's server has no `/health`; use `/v1/models`).
    #[serde(default)]
    pub health_path: Option<String>,
    /// Where this worker serves its Prometheus text, when not at `[load] metrics_path`.
    #[serde(default)]
    pub metrics_path: Option<String>,
    /// Requests in flight this worker may hold, overriding `[admission]
    /// max_in_flight_per_worker`; 0 = no cap for this worker. Unset: the fleet default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    /// The name an `https://` worker's certificate is checked against (and sent as SNI) when it
    /// is not the URL's host: a worker addressed by IP whose certificate names a DNS name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// The models this worker serves (as in a request body's `model`); empty: none declared
    /// (then no worker of the fleet may declare one). Each model is routed over its own ring of
    /// the workers that serve it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}

/// Longest worker name accepted, in characters (each one byte: names are ASCII).
pub const MAX_WORKER_NAME_CHARS: usize = 128;

/// Whether `name` is a worker name: 1 to [`MAX_WORKER_NAME_CHARS`] visible ASCII characters (`!`
/// through `~`) other than `/`, `\` and `"`, and neither `.` nor `..`. The error says which rule
/// the name breaks, quoting it escaped.
///
/// A name is shown in log lines, metric labels, JSON, the `x-bch-worker` header and a URL path
/// segment: visible ASCII reads the same in all of them, and nothing in it can break a log line,
/// spoof a field with a space, reorder text (bidirectional overrides), hide (a BOM, zero-width
/// characters) or look like another name (homoglyphs). `/` would split the admin API's
/// `/admin/workers/{name}` path; `\` and `"` are the escape characters of every quoted form.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '/' | '\\' | '"'))
    {
        return Err(format!(
            "{name:?} has the character {:?} (U+{:04X}); a worker name is visible ASCII (`!` to `~`) without '/', '\\' or '\"'",
            bad, bad as u32
        ));
    }
    if name.len() > MAX_WORKER_NAME_CHARS {
        return Err(format!(
            "{name:?} is longer than {MAX_WORKER_NAME_CHARS} characters"
        ));
    }
    if name == "." || name == ".." {
        // Clients resolve dot segments before sending (even `%2e%2e`), so
        // `DELETE /admin/workers/..` could never reach such a worker.
        return Err(format!(
            "{name:?} is a path segment clients rewrite; choose another name"
        ));
    }
    Ok(())
}

/// A worker entry that passed validation: the router's spec plus what only gatewayd needs, with
/// the URL already parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Name, URL as written and ring identity, as the router sees them.
    pub spec: WorkerSpec,
    /// The URL, parsed.
    pub url: WorkerUrl,
    /// This worker's own health probe path, when it has one.
    pub health_path: Option<String>,
    /// This worker's own metrics path, when it has one.
    pub metrics_path: Option<String>,
    /// The name its certificate is checked against: the `server_name` override, else the URL's
    /// host; `None` for an `http://` worker.
    pub server_name: Option<ServerName<'static>>,
}

impl WorkerConfig {
    /// A worker entry for a bare URL (the `--worker` flag and the admin API's minimal body).
    pub fn from_url(url: &str) -> WorkerConfig {
        WorkerConfig {
            name: None,
            url: url.to_owned(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        }
    }

    /// Validates the entry; the error names the field within the entry (`url`, `name`,
    /// `health_path`, `metrics_path`, `models`, `ring_id`, `server_name`).
    pub fn member(&self) -> Result<Member, FieldError> {
        let invalid = |field: &str, message: String| FieldError::new(field, message);
        let url = WorkerUrl::parse(&self.url).map_err(|e| invalid("url", e.to_string()))?;
        let name = match &self.name {
            Some(name) => name.clone(),
            None => url.default_name(),
        };
        check_name(&name).map_err(|why| invalid("name", why))?;
        for (field, path) in [
            ("health_path", &self.health_path),
            ("metrics_path", &self.metrics_path),
        ] {
            if path.as_ref().is_some_and(|p| !p.starts_with('/')) {
                return Err(invalid(field, "must start with '/'".into()));
            }
        }
        super::models::check_models(&self.models)?;
        if self.ring_id.as_ref().is_some_and(String::is_empty) {
            return Err(invalid("ring_id", "must not be empty".into()));
        }
        if let Some(cap) = self.max_in_flight {
            bch_core::admission::check_cap("max_in_flight", cap)
                .map_err(|e| invalid("max_in_flight", e.to_string()))?;
        }
        let server_name = match (&self.server_name, url.is_https()) {
            (Some(_), false) => {
                return Err(invalid(
                    "server_name",
                    "only an https:// worker has a certificate to check".into(),
                ));
            }
            (Some(name), true) => Some(ServerName::try_from(name.clone()).map_err(|_| {
                invalid(
                    "server_name",
                    format!("{name:?} is not a DNS name or IP address"),
                )
            })?),
            (None, true) => Some(
                ServerName::try_from(url.host_and_port().0.to_owned()).map_err(|_| {
                    invalid(
                        "url",
                        format!(
                            "{:?} is no TLS server name; set server_name",
                            url.authority.host()
                        ),
                    )
                })?,
            ),
            (None, false) => None,
        };
        Ok(Member {
            spec: WorkerSpec {
                name,
                url: self.url.clone(),
                ring_id: self.ring_id.clone(),
                source: WorkerSource::Static,
                max_in_flight: self.max_in_flight,
                models: self.models.clone(),
            },
            url,
            health_path: self.health_path.clone(),
            metrics_path: self.metrics_path.clone(),
            server_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use http::uri::PathAndQuery;

    use super::*;

    #[test]
    fn a_cap_above_a_million_is_refused_naming_the_field() {
        let mut worker = WorkerConfig::from_url("http://127.0.0.1:9000");
        worker.max_in_flight = Some(1_000_001);
        let error = worker.member().unwrap_err();
        assert_eq!(error.field, "max_in_flight");
        assert!(error.message.contains("at most 1000000"), "{error:?}");
        worker.max_in_flight = Some(1_000_000);
        assert!(worker.member().is_ok());
    }

    #[test]
    fn names_default_to_authority_and_urls_join() {
        let member = WorkerConfig::from_url("http://10.0.0.7:8000/prefix/")
            .member()
            .unwrap();
        assert_eq!(member.spec.name, "10.0.0.7:8000");
        assert_eq!(member.spec.ring_id(), "http://10.0.0.7:8000/prefix/");
        let pq: PathAndQuery = "/v1/models?x=1".parse().unwrap();
        assert_eq!(
            member.url.join(Some(&pq)).unwrap().to_string(),
            "http://10.0.0.7:8000/prefix/v1/models?x=1"
        );
    }

    #[test]
    fn https_workers_check_their_host_or_the_server_name_override() {
        let member = WorkerConfig::from_url("https://gpu-0.example")
            .member()
            .unwrap();
        assert_eq!(member.url.host_and_port(), ("gpu-0.example", 443));
        assert!(
            member.url.backend.to_string().contains(":443"),
            "{}",
            member.url.backend
        );
        assert_eq!(member.server_name.unwrap().to_str(), "gpu-0.example");
        let by_ip = WorkerConfig {
            server_name: Some("gpu-0.example".into()),
            ..WorkerConfig::from_url("https://[::1]:8443")
        }
        .member()
        .unwrap();
        assert_eq!(by_ip.url.host_and_port(), ("::1", 8443));
        assert_eq!(by_ip.server_name.unwrap().to_str(), "gpu-0.example");
        let plain = WorkerConfig::from_url("http://a:1").member().unwrap();
        assert!(plain.server_name.is_none() && !plain.url.is_https());
    }

    #[test]
    fn refusals_name_the_field() {
        for (entry, field) in [
            (WorkerConfig::from_url("ftp://a:1"), "url"),
            (
                WorkerConfig {
                    server_name: Some("gpu-0.example".into()),
                    ..WorkerConfig::from_url("http://10.0.0.7:8000")
                },
                "server_name",
            ),
            (
                WorkerConfig {
                    server_name: Some("not a name".into()),
                    ..WorkerConfig::from_url("https://10.0.0.7:8000")
                },
                "server_name",
            ),
            (WorkerConfig::from_url("http://a:1/?q=1"), "url"),
            (WorkerConfig::from_url("http://a:1/#f"), "url"),
            (WorkerConfig::from_url("http://a:0"), "url"),
            (WorkerConfig::from_url("http://a:99999"), "url"),
            (WorkerConfig::from_url("http://a:"), "url"),
            (WorkerConfig::from_url("http://[::1]:65536"), "url"),
            (WorkerConfig::from_url("http://u:p@a:1"), "url"),
            (
                WorkerConfig {
                    name: Some("..".into()),
                    ..WorkerConfig::from_url("http://a:1")
                },
                "name",
            ),
            (
                WorkerConfig {
                    name: Some(".".into()),
                    ..WorkerConfig::from_url("http://a:1")
                },
                "name",
            ),
            (
                WorkerConfig {
                    name: Some(" ".into()),
                    ..WorkerConfig::from_url("http://a:1")
                },
                "name",
            ),
            (
                WorkerConfig {
                    health_path: Some("health".into()),
                    ..WorkerConfig::from_url("http://a:1")
                },
                "health_path",
            ),
            (
                WorkerConfig {
                    metrics_path: Some("metrics".into()),
                    ..WorkerConfig::from_url("http://a:1")
                },
                "metrics_path",
            ),
        ] {
            assert_eq!(entry.member().unwrap_err().field, field, "{entry:?}");
        }
    }

    #[test]
    fn names_are_visible_ascii_without_slash_backslash_or_quote() {
        let named = |name: &str| {
            WorkerConfig {
                name: Some(name.to_owned()),
                ..WorkerConfig::from_url("http://a:1")
            }
            .member()
        };
        for good in [
            "gpu-0",
            "10.0.0.7:8000",
            "[::1]:8000",
            "a.b_c~d@e+f%g",
            &"x".repeat(MAX_WORKER_NAME_CHARS),
        ] {
            assert_eq!(named(good).unwrap().spec.name, good);
        }
        for (bad, shown) in [
            ("gpu\u{202e}0", "\\u{202e}"),
            ("gpu\u{2028}0", "\\u{2028}"),
            ("\u{feff}gpu", "\\u{feff}"),
            ("gpu 0", "' '"),
            ("gpu\t0", "'\\t'"),
            ("gpu\n0", "'\\n'"),
            ("gpu\u{7f}", "\\u{7f}"),
            ("gpu\u{200b}0", "\\u{200b}"),
            ("gp\u{fc}", "'\u{fc}'"),
            ("a/b", "'/'"),
            ("a\\b", "'\\\\'"),
            ("a\"b", "'\"'"),
            ("", "empty"),
            (".", "path segment"),
            ("..", "path segment"),
        ] {
            let error = named(bad).unwrap_err();
            assert_eq!(error.field, "name", "{bad:?}");
            assert!(error.message.contains(shown), "{bad:?}: {error}");
            assert!(
                !error
                    .message
                    .contains(['\u{202e}', '\u{2028}', '\u{feff}', '\n']),
                "the refusal quotes the name escaped: {error}"
            );
        }
        let long = named(&"x".repeat(MAX_WORKER_NAME_CHARS + 1)).unwrap_err();
        assert!(long.message.contains("longer than 128"), "{long}");
    }

    #[test]
    fn credentials_are_refused_without_being_echoed() {
        for url in [
            "http://user:s3cret@127.0.0.1:8000",
            "http://user:s3cret@127.0.0.1:99999/x",
            "http://s3cret@h:1",
            "user:s3cret@h:1",
            "http://a:s3cret@b@h:1/p",
        ] {
            let error = WorkerConfig::from_url(url).member().unwrap_err();
            assert_eq!(error.field, "url", "{url}");
            assert!(!error.message.contains("s3cret"), "{url}: {error}");
            assert!(error.message.contains("***@"), "{url}: {error}");
        }
    }
}
