//! The console at fleet scale: 10,000 workers built through the front door (a snapshot frame and
//! ticks). The workers panel shows the fleet summary when not every worker has a row; `f` finds a
//! worker by name and selects it, `h` jumps to the hottest one; only the visible rows are built,
//! in the same order as the whole list.

mod common;
#[path = "common_fleet/scale_fleet.rs"]
mod scale_fleet;

use bch_tui::{Action, Panel, State, WorkerOrder};
use insta::assert_snapshot;
use ratatui::layout::Rect;
use tokio::time::Instant;

use common::render;
use scale_fleet::{HOTTEST_LOAD, fleet, hottest, worker_name};

const WORKERS: usize = 10_000;

/// Tells the state what a `width × height` terminal shows, as the app does before each draw, so
/// jumps scroll the selection into view.
fn sized(mut s: State, width: u16, height: u16) -> State {
    let rows = bch_tui::viewports(Rect::new(0, 0, width, height), &s);
    s.set_viewports(rows);
    s
}

fn type_text(s: &mut State, text: &str) {
    for c in text.chars() {
        s.apply_action(Action::SearchChar(c));
    }
}

/// The screen line holding the selected worker's row (`▸` before its name).
fn selected_line(screen: &str) -> &str {
    screen
        .lines()
        .find(|l| l.contains('▸'))
        .unwrap_or_else(|| panic!("no selected row on screen:\n{screen}"))
}

#[test]
fn ten_thousand_workers_80x24() {
    let s = sized(fleet(WORKERS), 80, 24);
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

#[test]
fn ten_thousand_workers_120x40() {
    let s = sized(fleet(WORKERS), 120, 40);
    let screen = render(&s, 120, 40, Instant::now());
    assert!(
        screen.contains("loads "),
        "the fleet summary shows:\n{screen}"
    );
    assert!(
        screen.contains(&format!(
            "hottest {} {HOTTEST_LOAD}",
            worker_name(hottest(WORKERS))
        )),
        "{screen}"
    );
    assert_snapshot!(screen);
}

#[test]
fn search_finds_a_worker_by_name_selects_it_and_scrolls_to_it() {
    let mut s = sized(fleet(WORKERS), 120, 40);
    s.apply_action(Action::StartSearch);
    type_text(&mut s, "GPU-0777");
    // Live: the selection follows the first match as the name is typed (case ignored).
    assert_eq!(s.selected_worker().unwrap().name, "gpu-07770");
    type_text(&mut s, "7");
    let screen = render(&s, 120, 40, Instant::now());
    assert!(screen.contains("find GPU-07777▏"), "{screen}");
    assert!(screen.contains("1 match"), "{screen}");
    s.apply_action(Action::SearchApply);
    assert_eq!(s.ui().search(), None, "Enter closes the prompt");
    assert_eq!(s.selected_worker().unwrap().name, "gpu-07777");
    let screen = render(&s, 120, 40, Instant::now());
    assert!(selected_line(&screen).contains("gpu-07777"), "{screen}");
    // The drain keys now act on the worker found.
    s.apply_action(Action::Scroll(1));
    assert_eq!(s.selected_worker().unwrap().name, "gpu-07778");
}

#[test]
fn search_edits_follow_and_esc_goes_back() {
    let mut s = sized(fleet(WORKERS), 120, 40);
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::StartSearch);
    assert_eq!(
        s.ui().focus(),
        Panel::Workers,
        "the search shows on the workers panel"
    );
    type_text(&mut s, "gpu-0001");
    assert_eq!(s.selected_worker().unwrap().name, "gpu-00010");
    for _ in 0..4 {
        s.apply_action(Action::SearchBackspace);
    }
    type_text(&mut s, "09999");
    assert_eq!(s.selected_worker().unwrap().name, "gpu-09999");
    assert!(s.scroll(Panel::Workers) > 9_000, "scrolled to the match");
    type_text(&mut s, "x");
    let screen = render(&s, 120, 40, Instant::now());
    assert!(screen.contains("no match"), "{screen}");
    assert_eq!(
        s.selected_worker().unwrap().name,
        "gpu-09999",
        "no match leaves the selection where it is"
    );
    s.apply_action(Action::SearchCancel);
    assert_eq!(s.ui().search(), None);
    assert_eq!(s.ui().focus(), Panel::Ring, "focus back where it was");
    assert_eq!(s.scroll(Panel::Workers), 0);
    assert_eq!(
        s.ui().selected_worker(),
        None,
        "selection back to none picked"
    );
}

/// `w1` finds w1 even where `w10`, which also contains it, comes first (by load).
#[test]
fn search_prefers_the_exact_name() {
    let mut s = common::connected_with(|snap| {
        let template = snap.workers[0].clone();
        snap.workers = (0..12)
            .map(|i| bch_core::telemetry::WorkerRecord {
                name: format!("w{i}"),
                active: if i == 10 { 9 } else { 1 },
                ..template.clone()
            })
            .collect();
    });
    s.apply_action(Action::ToggleWorkerOrder);
    assert_eq!(s.worker_rows()[0].name, "w10");
    s.apply_action(Action::StartSearch);
    type_text(&mut s, "w1");
    s.apply_action(Action::SearchApply);
    assert_eq!(s.selected_worker().unwrap().name, "w1");
}

#[test]
fn jump_to_hottest_selects_the_worker_with_the_highest_load() {
    let mut s = sized(fleet(WORKERS), 80, 24);
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::JumpHottest);
    let hot = s.selected_worker().unwrap();
    assert_eq!(hot.name, worker_name(hottest(WORKERS)));
    assert_eq!(hot.rule_load(), HOTTEST_LOAD);
    let highest = s.visible().workers.iter().map(|w| w.rule_load()).max();
    assert_eq!(Some(hot.rule_load()), highest);
    assert_eq!(s.ui().focus(), Panel::Workers);
    let screen = render(&s, 80, 24, Instant::now());
    assert!(
        selected_line(&screen).contains(&worker_name(hottest(WORKERS))),
        "{screen}"
    );
}

/// The rows a frame builds are the rows of the whole ordered list, in either order, anywhere in
/// the list (ties in load keep configuration order).
#[test]
fn the_window_of_rows_is_a_slice_of_the_whole_list() {
    let mut s = fleet(1_000);
    for order in [WorkerOrder::Config, WorkerOrder::Load] {
        if s.ui().worker_order() != order {
            s.apply_action(Action::ToggleWorkerOrder);
        }
        let all: Vec<&str> = s.worker_rows().iter().map(|w| w.name.as_str()).collect();
        for (start, len) in [(0, 1), (0, 37), (5, 20), (480, 40), (990, 20), (1_200, 5)] {
            let window: Vec<&str> = s
                .worker_window(start, len)
                .iter()
                .map(|w| w.name.as_str())
                .collect();
            let expected: Vec<&str> = all.iter().skip(start).take(len).copied().collect();
            assert_eq!(window, expected, "{order:?} rows {start}+{len}");
        }
    }
}
