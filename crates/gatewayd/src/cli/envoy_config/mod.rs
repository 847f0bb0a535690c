//! `gatewayd envoy-config`: an Envoy v3 bootstrap (YAML) that proxies through Envoy with gatewayd
//! as its endpoint picker, complete and usable as is with Envoy 1.40 (docs/envoy.md explains
//! every part). The workers, timeouts and fallback count come from gatewayd's own configuration,
//! so the two cannot disagree about them.
//!
//! Two files at the seam between checking and writing: `plan` turns the flags and gatewayd's
//! configuration into an [`EnvoyPlan`] (every check, every error naming its field), and
//! `bootstrap` writes a plan as YAML (no checks, no failures), so the YAML can be tested from a
//! plan built by hand and the checks without reading YAML.

mod bootstrap;
mod plan;

use std::process::ExitCode;

use self::bootstrap::bootstrap;
pub use self::plan::{EnvoyConfigArgs, EnvoyPlan};
use crate::app::terminal::{print_err, print_out};

/// Prints the bootstrap for `args` on stdout; errors (naming the field) on stderr, exit 1.
pub fn print(args: &EnvoyConfigArgs) -> ExitCode {
    match EnvoyPlan::from_args(args) {
        Ok(plan) => {
            if !plan.discovery.is_empty() {
                print_err(format_args!(
                    "warning: workers discovered in DNS ({}) are not in the generated cluster: give Envoy the same workers (EDS, a STRICT_DNS cluster, an InferencePool), or it cannot follow the picker to them (docs/envoy.md)",
                    plan.discovery.join(", ")
                ));
            } else if plan.workers.is_empty() {
                print_err(format_args!(
                    "warning: no workers: every request through Envoy will get 503 from the picker"
                ));
            }
            match print_out(format_args!("{}", bootstrap(&plan))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(closed) => closed.exit(),
            }
        }
        Err(e) => {
            print_err(format_args!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}
