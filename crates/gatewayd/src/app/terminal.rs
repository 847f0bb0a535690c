//! What gatewayd writes for people rather than for its log: the one-shot subcommands' answers on
//! stdout, their errors and warnings and the daemon's banner on stderr. `println!` and
//! `eprintln!` panic when the write fails — stdout a pipe whose reader exited (`gatewayd explain
//! … | head -1`), stderr a log shipper that went away — so a command would die with a panic
//! message and exit status 101 instead of stopping. These never panic.

use std::fmt;
use std::io::Write;
use std::process::ExitCode;

/// Stdout could not take the output.
#[derive(Debug)]
pub struct StdoutClosed(std::io::Error);

impl StdoutClosed {
    /// The exit status of a command whose output was cut: failure (the output is incomplete),
    /// after saying why on stderr, except when the reader simply left (a broken pipe: `| head`
    /// read what it wanted, and a message would only clutter the terminal).
    pub fn exit(&self) -> ExitCode {
        if self.0.kind() != std::io::ErrorKind::BrokenPipe {
            print_err(format_args!("error: cannot write the output: {}", self.0));
        }
        ExitCode::FAILURE
    }
}

impl From<std::io::Error> for StdoutClosed {
    fn from(error: std::io::Error) -> Self {
        StdoutClosed(error)
    }
}

/// Writes `text` to stdout and flushes it; the error says the output did not all arrive.
pub fn print_out(text: fmt::Arguments<'_>) -> Result<(), StdoutClosed> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(text)?;
    out.flush()?;
    Ok(())
}

/// Writes `line` and a newline to stderr; a line that cannot be written is lost, nothing more
/// (there is nowhere left to report it).
pub fn print_err(line: fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(line).and_then(|()| err.write_all(b"\n"));
}
