//! gatewayd's log: `tracing` lines on stderr, text or JSON, filtered by `[log] level` (`RUST_LOG`
//! wins when set).
//!
//! Text lines carry strings from outside: worker names and URLs, DNS names, a worker's error text,
//! a client's request id and path. [`EscapedFields`] writes every field so that none of them can
//! break the line or spoof a field: a value that is not plain visible ASCII is quoted and escaped
//! (`"gpu\u{2028}status=500"`), and the message has its unprintable characters escaped. JSON lines
//! need nothing: JSON escapes quotes and control characters itself.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

use crate::config::{Config, LogFormat};

/// Installs the global subscriber for `config`'s `[log]` section. A second call (tests start many
/// gateways in one process) keeps the first subscriber.
pub fn init_logging(config: &Config) {
    let level = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|level| !level.is_empty() && EnvFilter::try_new(level).is_ok())
        .unwrap_or_else(|| config.log.level.clone());
    let filter = EnvFilter::new(quiet_tls_library(&level));
    // Colour only on a terminal: under systemd or a log shipper escapes would garble the lines.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        // A line that cannot be written (stderr a broken pipe: `gatewayd | tee` after a Ctrl-C,
        // a log shipper that restarts) is lost, nothing more. By default the subscriber reports
        // the failure with `eprintln!`, which panics on the same broken stderr, inside whatever
        // task was logging: the request's connection would be reset and the signal task would
        // die before starting the shutdown.
        .log_internal_errors(false);
    let _ = match config.log.format {
        LogFormat::Text => builder.fmt_fields(EscapedFields).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// `level` (`RUST_LOG`'s or `[log] level`) with rustls's own log held to errors unless `level`
/// names rustls: rustls logs a
/// warning for every handshake of a client that sends an IP address as its server name (wrk,
/// `curl --resolve`, many load balancers' health checks), one line per connection under load, which
/// says nothing an operator can act on and costs the handshake a formatted write.
fn quiet_tls_library(level: &str) -> String {
    if level.contains("rustls") {
        level.to_owned()
    } else {
        format!("{level},rustls=error")
    }
}

/// The text log's field formatter: `name=value` pairs after the message, like `tracing`'s own,
/// except that no value or message can hold a raw line break, control, format or bidirectional
/// character, and a value with a space or a quote is always quoted (see the module documentation).
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Writes one event's (or span's) fields for [`EscapedFields`].
struct EscapingVisitor<'writer> {
    writer: Writer<'writer>,
    /// No field written yet (no separating space needed).
    first: bool,
    result: fmt::Result,
}

impl EscapingVisitor<'_> {
    /// Writes `field` with the value `text`; `quoted`: always as a quoted string (a `&str` value,
    /// as `tracing` writes them), else bare when that is safe.
    fn write(&mut self, field: &Field, text: &str, quoted: bool) {
        let name = field.name();
        // Metadata of `log` records, already in the line's head.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        self.result = self.write_field(name, text, quoted);
    }

    fn write_field(&mut self, name: &str, text: &str, quoted: bool) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.writer.write_char(' ')?;
        }
        if name == "message" {
            return write_escaped(&mut self.writer, text);
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        if self.writer.has_ansi_escapes() {
            // Italic name, dimmed `=`: the look of `tracing`'s own text lines on a terminal.
            write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
        } else {
            write!(self.writer, "{name}=")?;
        }
        if !quoted && (is_bare(text) || is_quoted_literal(text)) {
            self.writer.write_str(text)
        } else {
            write!(self.writer, "{text:?}")
        }
    }
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, value, true);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.write(field, &crate::error::display_chain(value), false);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` arrives here too (as a Debug that displays): its text is judged like any other.
        self.write(field, &format!("{value:?}"), false);
    }
}

/// Whether `c` is written escaped: anything `{:?}` escapes (control, format and bidirectional
/// characters, line and paragraph separators, spaces other than U+0020, a BOM, combining marks)
/// except the quotes and the backslash, which are harmless outside a quoted value.
fn needs_escape(c: char) -> bool {
    !matches!(c, '"' | '\'' | '\\') && c.escape_debug().len() > 1
}

/// A value written as it is: one or more visible ASCII characters, no quote. It has no space, so
/// it cannot end its field and start another.
fn is_bare(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_graphic() && c != '"')
}

/// Whether `text` is exactly one string literal as `{:?}` writes it (`"a \"b\"\n"`): a `?x`
/// field, already quoted and escaped, written as it is rather than quoted twice.
fn is_quoted_literal(text: &str) -> bool {
    let Some(inner) = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return false;
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        let fits = match c {
            // An escape: the next character is part of it (a final `\` would escape the quote).
            '\\' => chars.next().is_some(),
            '"' => false,
            c => !needs_escape(c),
        };
        if !fits {
            return false;
        }
    }
    true
}

/// Writes a message with its unprintable characters escaped as `{:?}` does (`\n`, `\u{2028}`):
/// a message stays one line and shows what it holds.
fn write_escaped(writer: &mut impl fmt::Write, text: &str) -> fmt::Result {
    for c in text.chars() {
        if needs_escape(c) {
            write!(writer, "{}", c.escape_debug())?;
        } else {
            writer.write_char(c)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Everything written to it, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The text line `log` writes through gatewayd's field formatter, without the timestamp.
    fn text_line(log: impl FnOnce()) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .fmt_fields(EscapedFields)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn hostile_text_in_any_field_stays_on_one_line_escaped() {
        let hostile = "gpu\u{2028}x\u{202e}y\u{feff}\r\n2026-01-01 ERROR status=500 \u{1b}[31m";
        let line = text_line(|| {
            tracing::warn!(
                worker = %hostile,
                url = ?hostile,
                path = hostile,
                error = %format!("gone: {hostile}"),
                "bad record skipped: {hostile}"
            );
        });
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(line.ends_with('\n'));
        for raw in ['\u{2028}', '\u{202e}', '\u{feff}', '\r', '\u{1b}'] {
            assert!(!line.contains(raw), "{raw:?} raw in {line:?}");
        }
        let quoted = r#""gpu\u{2028}x\u{202e}y\u{feff}\r\n2026-01-01 ERROR status=500 \u{1b}[31m""#;
        assert!(line.contains(&format!(" worker={quoted}")), "{line}");
        assert!(line.contains(&format!(" url={quoted} ")), "{line}");
        assert!(line.contains(&format!(" path={quoted} ")), "{line}");
        assert!(line.contains(r#" error="gone: gpu\u{2028}"#), "{line}");
        assert!(
            line.contains(r"bad record skipped: gpu\u{2028}x\u{202e}y\u{feff}\r\n2026"),
            "{line}"
        );
    }

    #[test]
    fn plain_values_stay_bare_and_spaces_or_quotes_are_quoted() {
        let line = text_line(|| {
            tracing::info!(
                worker = %"gpu-0",
                url = %"http://10.0.0.7:8000",
                active = 3,
                healthy = true,
                spoof = %"a status=200",
                quote = %"a\"b",
                empty = %"",
                named = ?"x y",
                nbsp = %"a\u{a0}b",
                "worker added"
            );
        });
        assert_eq!(
            line.trim_end(),
            r#" INFO worker added worker=gpu-0 url=http://10.0.0.7:8000 active=3 healthy=true spoof="a status=200" quote="a\"b" empty="" named="x y" nbsp="a\u{a0}b""#
        );
    }

    /// A client sending an IP address as its server name made rustls warn on every handshake:
    /// under a load of new connections, one log line each.
    #[test]
    fn rustls_warnings_are_dropped_unless_the_level_names_rustls() {
        let lines = |level: &str| {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new(quiet_tls_library(level)))
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                tracing::warn!(target: "rustls::msgs::handshake", "Illegal SNI extension");
                tracing::warn!(target: "gatewayd::tls", "certificate expires soon");
            });
            String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
        };
        let quiet = lines("warn");
        assert!(!quiet.contains("Illegal SNI"), "{quiet}");
        assert!(quiet.contains("certificate expires soon"), "{quiet}");
        let asked = lines("warn,rustls=warn");
        assert!(asked.contains("Illegal SNI"), "{asked}");
    }

    #[test]
    fn only_whole_debug_literals_pass_as_quoted() {
        assert!(is_quoted_literal(r#""a \"b\" \\""#));
        assert!(is_quoted_literal(r#""""#));
        assert!(!is_quoted_literal(r#""a" status="b""#));
        assert!(!is_quoted_literal(r#""a\""#));
        assert!(!is_quoted_literal("\"a\u{2028}b\""));
        assert!(!is_quoted_literal("\""));
    }
}
