//! The A/B harness: the same storm under several routing policies and admission settings ("cells"), repeated and
//! interleaved, with paired 95% intervals of throughput, TTFT mean and p99 and the cached-token
//! fraction against the first cell and between the other cells. The gateway's policy is restored
//! afterwards, also after an error or an interruption.
//!
//! Cells are written `strict,gap=1,gap=2,gap=4`: cells are separated by `,`, and options within a cell
//! by `:`, e.g. `gap=2:skew=1.25`. See [`parse_cells`].
//!
//! Repetitions are interleaved: repetition 1 runs every cell in the given order, repetition 2 in
//! reverse, repetition 3 forward again, and so on. Over each pair of repetitions every cell sits at
//! the same mean position, so a linear drift of the machine (warming, throttling) cancels instead of
//! favouring the cells that happen to run first. Each run uses its own prompt seed, so every run starts
//! with prompts that no worker has cached: a cell never inherits a warm cache from the run before it.
//!
//! The pieces, each depending only on those listed before it: `admission` (bch-core's
//! admission settings set from cell options), `cells` (parsing the cells), `report`
//! (the report's types), `verdict` (the conclusions in words), `summary` (summaries and comparisons
//! from the runs), `table` (the printed tables), `run` (driving the gateway through the runs), `plot`
//! (the chart).

mod admission;
mod cells;
mod plot;
mod report;
mod run;
mod summary;
mod table;
mod verdict;

pub use cells::{Cell, parse_cells};
pub use plot::write_plot;
pub use report::{AbMeta, AbReport, AbRun, CellSummary, Comparison, WorkerInfo};
pub use run::{AbConfig, run_ab};
pub use verdict::MIN_REPS_FOR_CLAIMS;

pub use crate::stats::{PairedDifference, PairedRatio, Significance};
