//! The cells of an A/B run: the policy and admission settings under test, written
//! `strict,gap=1,gap=2:skew=1.25`, and the `PUT /admin/policy` body each one sends.

use anyhow::Context as _;
use bch_core::admission::AdmissionSettings;
use bch_core::fleet_load::LoadSource;
use bch_core::policy::{PolicyKind, PolicyPatch, SpillOrder};
use serde::Serialize;
use serde_json::Value;

use super::admission::set_field;

/// One policy setting under test.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// The cell as written, e.g. `gap=2:skew=1.25`.
    pub label: String,
    /// The policy fields of the `PUT /admin/policy` body that selects it.
    pub policy: PolicyPatch,
    /// The admission settings sent under `admission` in the same body; `None` when no cell names
    /// admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSettings>,
}

impl Cell {
    /// The `PUT /admin/policy` body: the policy fields, and `admission` when the cell has it.
    pub fn body(&self) -> Value {
        let mut body = serde_json::to_value(self.policy).expect("a policy patch serialises");
        if let Some(admission) = &self.admission {
            body["admission"] =
                serde_json::to_value(admission).expect("admission settings serialise");
        }
        body
    }
}

/// `max_load_skew` of a bounded cell that names none.
const DEFAULT_SKEW: f64 = 1.5;
/// `min_load_gap` (in requests) of a bounded cell that names none, gatewayd's default.
const DEFAULT_GAP: u64 = 2;

/// Parses a cell list.
///
/// Cells are separated by `,`; options within a cell by `:`. Options:
///
/// - `strict` (or `consistent_hashing`): `{"kind":"consistent_hashing"}`;
/// - `bounded` (or `bounded_consistent_hashing`): the bounded policy with default thresholds;
/// - `gap=N`: bounded with `min_load_gap` N; `skew=X`: bounded with `max_load_skew` X;
///   `order=ring|hash_seeded`: bounded with that `spill_order`. A bounded cell always sends both
///   thresholds and the spill order (defaults gap 2, skew 1.5, ring), so a cell never inherits the
///   previous cell's value;
/// - `round_robin` (or `rr`), `random`: the baselines;
/// - `vnodes=N`: `virtual_nodes` N, combinable with any of the above;
/// - `load=local` or `load=worker_metrics`: the load source the rule reads, combinable with any of
///   the above. When one cell names a load source, every cell sends one (`local` unless it names
///   another), so no cell inherits the previous cell's;
/// - admission, with the gateway's `[admission]` field names: `max_in_flight_per_worker=N`,
///   `queue_timeout_ms=N`, `max_queued=N`, `retry_after_ms=N`, `max_waiting=N`, `max_kv_usage=X`,
///   and `admission=off` (every field at its default: no cap). When one cell names admission,
///   every cell sends all six fields (the defaults where it names none), so no cell inherits the
///   previous cell's. Cells of admission alone, with no policy kind in any cell, compare admission
///   under the policy in force.
///
/// # Errors
///
/// On an empty cell, a cell named twice, an unknown option, a bad number, two policy kinds in one
/// cell, or a cell without a policy (unless it names admission and no cell names a policy); the
/// message names the cell.
pub fn parse_cells(spec: &str) -> anyhow::Result<Vec<Cell>> {
    let mut cells: Vec<Cell> = Vec::new();
    for label in spec.split(',').map(str::trim) {
        anyhow::ensure!(!label.is_empty(), "empty cell in {spec:?}");
        let cell = parse_cell(label).with_context(|| format!("in cell {label:?}"))?;
        anyhow::ensure!(
            cells.iter().all(|c| c.label != cell.label),
            "cell {label:?} appears twice"
        );
        cells.push(cell);
    }
    if cells.iter().any(|c| c.policy.load_source.is_some()) {
        for cell in &mut cells {
            cell.policy.load_source.get_or_insert(LoadSource::Local);
        }
    }
    if cells.iter().any(|c| c.admission.is_some()) {
        for cell in &mut cells {
            cell.admission.get_or_insert_default();
        }
    }
    // A cell without a kind would run under the previous cell's policy.
    if cells.iter().any(|c| c.policy.kind.is_some())
        && let Some(bare) = cells.iter().find(|c| c.policy.kind.is_none())
    {
        anyhow::bail!(
            "in cell {:?}: no policy, while other cells name one: name strict, bounded, gap=N, \
             skew=X, round_robin or random",
            bare.label
        );
    }
    Ok(cells)
}

fn parse_cell(label: &str) -> anyhow::Result<Cell> {
    let mut options = CellOptions::default();
    for option in label.split(':').map(str::trim) {
        match option.split_once('=') {
            None => options.flag(option)?,
            Some((name, value)) => options.value(name, value)?,
        }
    }
    options.into_cell(label)
}

/// The options of one cell, as read so far.
#[derive(Default)]
struct CellOptions {
    kind: Option<PolicyKind>,
    gap: Option<u64>,
    skew: Option<f64>,
    order: Option<SpillOrder>,
    vnodes: Option<u32>,
    load_source: Option<LoadSource>,
    admission: Option<AdmissionSettings>,
}

impl CellOptions {
    fn set_kind(&mut self, kind: PolicyKind) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.kind.is_none_or(|old| old == kind),
            "two policy kinds in one cell"
        );
        self.kind = Some(kind);
        Ok(())
    }

    /// An option without `=`: a policy kind.
    fn flag(&mut self, option: &str) -> anyhow::Result<()> {
        match option {
            "strict" | "consistent_hashing" => self.set_kind(PolicyKind::ConsistentHashing),
            "bounded" | "bounded_consistent_hashing" => {
                self.set_kind(PolicyKind::BoundedConsistentHashing)
            }
            "rr" | "round_robin" => self.set_kind(PolicyKind::RoundRobin),
            "random" => self.set_kind(PolicyKind::Random),
            other => anyhow::bail!(
                "unknown option {other:?}; expected strict, bounded, gap=N, skew=X, \
                 order=ring|hash_seeded, vnodes=N, load=local|worker_metrics, round_robin or \
                 random"
            ),
        }
    }

    /// An option `name=value`: a threshold or the spill order (which imply the bounded policy), the
    /// virtual nodes or the load source.
    fn value(&mut self, name: &str, value: &str) -> anyhow::Result<()> {
        match name {
            "gap" => {
                self.set_kind(PolicyKind::BoundedConsistentHashing)?;
                self.gap = Some(
                    value
                        .parse::<u64>()
                        .with_context(|| format!("gap must be an integer >= 0, got {value:?}"))?,
                );
            }
            "skew" => {
                self.set_kind(PolicyKind::BoundedConsistentHashing)?;
                let x: f64 = value
                    .parse()
                    .with_context(|| format!("skew must be a number, got {value:?}"))?;
                anyhow::ensure!(
                    x.is_finite() && x >= 1.0,
                    "skew must be a finite number >= 1.0, got {x}"
                );
                self.skew = Some(x);
            }
            "order" => {
                self.set_kind(PolicyKind::BoundedConsistentHashing)?;
                self.order = Some(value.parse().map_err(|e| anyhow::anyhow!("{e}"))?);
            }
            "vnodes" => {
                let n: u32 = value
                    .parse()
                    .with_context(|| format!("vnodes must be a positive integer, got {value:?}"))?;
                anyhow::ensure!(n > 0, "vnodes must be at least 1");
                self.vnodes = Some(n);
            }
            "load" => {
                self.load_source = Some(value.parse().map_err(|e| anyhow::anyhow!("{e}"))?);
            }
            "admission" => {
                anyhow::ensure!(value == "off", "admission takes only off, got {value:?}");
                self.admission = Some(AdmissionSettings::default());
            }
            other => {
                let mut admission = self.admission.unwrap_or_default();
                anyhow::ensure!(
                    set_field(&mut admission, other, value)?,
                    "unknown option {other:?}; expected gap, skew, order, vnodes, load, \
                     admission=off or an admission field (max_in_flight_per_worker, \
                     queue_timeout_ms, max_queued, retry_after_ms, max_waiting, max_kv_usage)"
                );
                self.admission = Some(admission);
            }
        }
        Ok(())
    }

    fn into_cell(self, label: &str) -> anyhow::Result<Cell> {
        anyhow::ensure!(
            self.kind.is_some() || self.admission.is_some(),
            "no policy: name strict, bounded, gap=N, skew=X, round_robin or random"
        );
        let bounded = self.kind == Some(PolicyKind::BoundedConsistentHashing);
        Ok(Cell {
            label: label.to_owned(),
            admission: self.admission,
            policy: PolicyPatch {
                kind: self.kind,
                min_load_gap: bounded.then(|| self.gap.unwrap_or(DEFAULT_GAP)),
                max_load_skew: bounded.then(|| self.skew.unwrap_or(DEFAULT_SKEW)),
                spill_order: bounded.then(|| self.order.unwrap_or_default()),
                virtual_nodes: self.vnodes,
                load_source: self.load_source,
                admission: None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn cells_parse_into_policy_bodies() {
        let cells = parse_cells("strict, gap=1,gap=2:skew=1.25,bounded:vnodes=300,rr").unwrap();
        let bodies: Vec<Value> = cells
            .iter()
            .map(|c| serde_json::to_value(c.policy).unwrap())
            .collect();
        assert_eq!(bodies[0], serde_json::json!({"kind": "consistent_hashing"}));
        assert_eq!(
            bodies[1],
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 1, "max_load_skew": 1.5,
                "spill_order": "ring"})
        );
        assert_eq!(
            bodies[2],
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.25,
                "spill_order": "ring"})
        );
        assert_eq!(
            bodies[3],
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.5,
                "spill_order": "ring", "virtual_nodes": 300})
        );
        assert_eq!(bodies[4], serde_json::json!({"kind": "round_robin"}));
        assert_eq!(cells[2].label, "gap=2:skew=1.25");
        let seeded = parse_cells("order=hash_seeded,gap=1:order=ring").unwrap();
        assert_eq!(
            serde_json::to_value(seeded[0].policy).unwrap(),
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2,
                "max_load_skew": 1.5, "spill_order": "hash_seeded"})
        );
        assert_eq!(seeded[1].policy.spill_order, Some(SpillOrder::Ring));
    }

    #[test]
    fn bad_cells_are_rejected_with_the_reason() {
        let err = |s: &str| format!("{:#}", parse_cells(s).unwrap_err());
        assert!(err("strict,,gap=1").contains("empty cell"));
        assert!(err("gap=x").contains("gap must be an integer"));
        assert!(err("skew=0.5").contains("skew must be a finite number >= 1.0"));
        assert!(err("strict:gap=1").contains("two policy kinds"));
        assert!(err("fast").contains("unknown option \"fast\""));
        assert!(err("vnodes=10").contains("no policy"));
        assert!(err("gap=1,gap=1").contains("appears twice"));
        assert!(err("order=next").contains("spill_order must be one of ring, hash_seeded"));
        assert!(err("rr:order=ring").contains("two policy kinds"));
        assert!(err("gap=1:load=gpu").contains("load_source must be local or worker_metrics"));
    }

    #[test]
    fn a_load_source_in_one_cell_is_sent_by_every_cell() {
        let cells = parse_cells("gap=2:load=worker_metrics,gap=2").unwrap();
        assert_eq!(cells[0].policy.load_source, Some(LoadSource::WorkerMetrics));
        assert_eq!(cells[1].policy.load_source, Some(LoadSource::Local));
        let body = serde_json::to_value(cells[0].policy).unwrap();
        assert_eq!(body["load_source"], "worker_metrics");
        let plain = parse_cells("gap=2,strict").unwrap();
        assert!(plain.iter().all(|c| c.policy.load_source.is_none()));
    }

    #[test]
    fn admission_options_fill_every_field_of_every_cell() {
        let cells = parse_cells(
            "gap=2:admission=off,gap=2:max_in_flight_per_worker=4:max_kv_usage=0.9,strict",
        )
        .unwrap();
        let off = AdmissionSettings::default();
        assert_eq!(cells[0].admission, Some(off));
        assert_eq!(cells[2].admission, Some(off), "no cell inherits");
        let capped = cells[1].admission.unwrap();
        assert_eq!(
            (
                capped.max_in_flight_per_worker,
                capped.max_kv_usage,
                capped.max_queued
            ),
            (4, 0.9, 1024)
        );
        let body = cells[1].body();
        assert_eq!(body["kind"], "bounded_consistent_hashing");
        assert_eq!(body["admission"]["max_in_flight_per_worker"], 4);
        assert_eq!(body["admission"]["retry_after_ms"], 1000);
        assert!(
            parse_cells("gap=2").unwrap()[0]
                .body()
                .get("admission")
                .is_none()
        );

        let bare =
            parse_cells("admission=off,queue_timeout_ms=500:max_in_flight_per_worker=2").unwrap();
        assert_eq!(bare[1].policy, PolicyPatch::default());
        let err = |s: &str| format!("{:#}", parse_cells(s).unwrap_err());
        assert!(err("strict,max_queued=5").contains("no policy, while other cells name one"));
        assert!(err("admission=on").contains("admission takes only off"));
        // The gateway's own rules and words (bch-core's `AdmissionSettings::validate`).
        assert!(err("max_kv_usage=1.5").contains("between 0.0 and 1.0"));
        assert!(err("queue_timeout_ms=600001").contains("queue_timeout_ms must be at most"));
        assert!(err("queue_timeout_ms=-1").contains("queue_timeout_ms must be an integer"));
    }
}
