//! Flag values for clap's `value_parser`, for every subcommand's flags: `IP:PORT` addresses (parsed,
//! never resolved), policy, spill order and load source names, and `explain`'s `URL=N` loads. The
//! error strings are what clap prints after the flag's name.

use std::net::SocketAddr;

use bch_core::fleet_load::LoadSource;
use bch_core::policy::{PolicyKind, SpillOrder};

/// Parses an `IP:PORT` flag value; the error says what is expected (host names are not resolved).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("expected IP:PORT such as 127.0.0.1:8080 (host names are not resolved), got {s:?}")
    })
}

/// A load source for clap: `local` or `worker_metrics`.
pub fn parse_load_source(s: &str) -> Result<LoadSource, String> {
    s.parse()
        .map_err(|e: bch_core::fleet_load::UnknownLoadSource| e.to_string())
}

/// A policy name for clap: `consistent_hashing`, `bounded_consistent_hashing`, `round_robin`,
/// `random`.
pub fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    s.parse()
        .map_err(|e: bch_core::policy::PolicyError| e.to_string())
}

/// A spill order name for clap: `ring` or `hash_seeded`.
pub fn parse_spill_order(s: &str) -> Result<SpillOrder, String> {
    s.parse()
        .map_err(|e: bch_core::policy::PolicyError| e.to_string())
}

/// A `URL=MODEL` pair for clap (`explain --serves`): a worker URL and one model it serves.
pub fn parse_serves(s: &str) -> Result<(String, String), String> {
    match s.rsplit_once('=') {
        Some((url, model)) if !url.is_empty() && !model.is_empty() => {
            Ok((url.to_owned(), model.to_owned()))
        }
        _ => Err(format!("expected URL=MODEL, got {s:?}")),
    }
}

/// A `URL=N` pair for clap (`explain --load` and its kin): a worker URL and a request count.
pub fn parse_load(s: &str) -> Result<(String, u64), String> {
    let (url, n) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("expected URL=N, got {s:?}"))?;
    let n = n
        .parse()
        .map_err(|_| format!("load in {s:?} must be a non-negative integer"))?;
    Ok((url.to_owned(), n))
}
