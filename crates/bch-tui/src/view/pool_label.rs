//! Which pool the panels show, for the header's first line (live and replay): `model NAME` while
//! one model's pool is picked, `all N models` while every worker of a fleet with models is shown,
//! nothing for a fleet without models. The model's name is gateway text, made printable and cut.

use ratatui::text::Span;

use super::styles::Styles;
use super::text::truncate_middle;
use crate::state::State;

/// Widest model name shown: the line must still say the connection at 80 columns.
const MODEL_W: usize = 24;

/// The label and the two blanks after it, or nothing.
pub(super) fn spans(state: &State, styles: &Styles) -> Vec<Span<'static>> {
    let label = match state.pool() {
        Some(model) => format!("model {}", truncate_middle(model, MODEL_W)),
        None => match state.whole().models().len() {
            0 => return Vec::new(),
            1 => "1 model".to_owned(),
            n => format!("all {n} models"),
        },
    };
    vec![Span::styled(label, styles.value()), Span::raw("  ")]
}
