//! gatewayd's log: `tracing` lines on stderr, text or JSON, filtered by `[log] level` (`RUST_LOG`
//! wins when set).

use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

/// Installs the global subscriber for `config`'s `[log]` section. A second call (tests start many
/// gateways in one process) keeps the first subscriber.
pub fn init_logging(config: &Config) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
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
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
