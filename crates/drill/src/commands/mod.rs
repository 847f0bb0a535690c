//! One module per subcommand, each running the arguments `main.rs` parsed on the library.

pub(crate) mod ab;
pub(crate) mod storm;
pub(crate) mod sweep;
pub(crate) mod workers;
