//! `--replay FILE`: a recording played in the same console. `chain` reads the file with the
//! files a gateway rotated it into, as one recording; `engine` rebuilds the console's state
//! at any recorded time (events applied as the live console applied them, checkpoints kept for
//! seeking back); `driver` is the interactive loop (keys, speed, the wall clock).

mod chain;
mod driver;
mod engine;

pub use driver::run_replay;
pub use engine::{Replay, SPEEDS};
