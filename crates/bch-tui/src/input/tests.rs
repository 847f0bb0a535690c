//! The key tables: every binding dispatches its action, no key is bound twice, and each mode's
//! keyboard rules.

use super::*;

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

#[test]
fn threshold_keys_distinguish_case() {
    let shift = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::SHIFT);
    assert_eq!(
        map_key(Mode::Normal, &key(KeyCode::Char('g'))),
        Some(Action::GapDown)
    );
    assert_eq!(map_key(Mode::Normal, &shift('G')), Some(Action::GapUp));
    assert_eq!(
        map_key(Mode::Normal, &key(KeyCode::Char('s'))),
        Some(Action::SkewDown)
    );
    assert_eq!(map_key(Mode::Normal, &shift('S')), Some(Action::SkewUp));
}

#[test]
fn filter_mode_types_letters_instead_of_commands() {
    assert_eq!(
        map_key(Mode::Filter, &key(KeyCode::Char('q'))),
        Some(Action::FilterChar('q'))
    );
    assert_eq!(
        map_key(Mode::Filter, &key(KeyCode::Char('g'))),
        Some(Action::FilterChar('g'))
    );
    assert_eq!(
        map_key(Mode::Filter, &key(KeyCode::Enter)),
        Some(Action::FilterApply)
    );
    assert_eq!(
        map_key(Mode::Filter, &key(KeyCode::Esc)),
        Some(Action::FilterClear)
    );
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(map_key(Mode::Filter, &ctrl_c), Some(Action::Quit));
}

#[test]
fn search_mode_types_letters_and_esc_goes_back() {
    assert_eq!(
        map_key(Mode::Search, &key(KeyCode::Char('h'))),
        Some(Action::SearchChar('h'))
    );
    assert_eq!(
        map_key(Mode::Search, &key(KeyCode::Enter)),
        Some(Action::SearchApply)
    );
    assert_eq!(
        map_key(Mode::Search, &key(KeyCode::Esc)),
        Some(Action::SearchCancel)
    );
    assert_eq!(
        map_key(Mode::Search, &key(KeyCode::Backspace)),
        Some(Action::SearchBackspace)
    );
}

#[test]
fn help_mode_closes_on_any_key_but_still_quits() {
    assert_eq!(
        map_key(Mode::Help, &key(KeyCode::Char('x'))),
        Some(Action::ToggleHelp)
    );
    assert_eq!(
        map_key(Mode::Help, &key(KeyCode::Char('q'))),
        Some(Action::Quit)
    );
}

#[test]
fn releases_and_ctrl_letters_are_ignored_and_repeats_act() {
    let mut release = key(KeyCode::Char('q'));
    release.kind = KeyEventKind::Release;
    assert_eq!(map_key(Mode::Normal, &release), None);
    let mut held = key(KeyCode::Down);
    held.kind = KeyEventKind::Repeat;
    assert_eq!(map_key(Mode::Normal, &held), Some(Action::Scroll(1)));
    let ctrl_g = KeyEvent::new(KeyCode::Char('g'), KeyModifiers::CONTROL);
    assert_eq!(map_key(Mode::Normal, &ctrl_g), None);
    assert_eq!(
        map_key(Mode::Normal, &key(KeyCode::PageDown)),
        Some(Action::Scroll(PAGE))
    );
}

/// One key per table entry, each with the action the old hand-written dispatcher gave it.
#[test]
fn every_binding_dispatches_its_action_and_no_key_is_bound_twice() {
    let shift = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::SHIFT);
    let ctrl = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL);
    let expected = [
        (key(KeyCode::Char('g')), Action::GapDown),
        (shift('G'), Action::GapUp),
        (key(KeyCode::Char('s')), Action::SkewDown),
        (shift('S'), Action::SkewUp),
        (key(KeyCode::Char('c')), Action::CapDown),
        (shift('C'), Action::CapUp),
        (key(KeyCode::Char('p')), Action::TogglePause),
        (key(KeyCode::Char('d')), Action::Drain),
        (key(KeyCode::Char('u')), Action::Undrain),
        (key(KeyCode::Char('l')), Action::ToggleWorkerOrder),
        (key(KeyCode::Char('m')), Action::CyclePool),
        (key(KeyCode::Char('f')), Action::StartSearch),
        (key(KeyCode::Char('h')), Action::JumpHottest),
        (key(KeyCode::Tab), Action::FocusNext),
        (key(KeyCode::BackTab), Action::FocusPrev),
        (key(KeyCode::Up), Action::Scroll(-1)),
        (key(KeyCode::Char('k')), Action::Scroll(-1)),
        (ctrl('k'), Action::Scroll(-1)),
        (key(KeyCode::Down), Action::Scroll(1)),
        (key(KeyCode::Char('j')), Action::Scroll(1)),
        (key(KeyCode::PageUp), Action::Scroll(-PAGE)),
        (key(KeyCode::PageDown), Action::Scroll(PAGE)),
        (key(KeyCode::Home), Action::ScrollTop),
        (key(KeyCode::End), Action::ScrollBottom),
        (key(KeyCode::Char('o')), Action::CycleSort),
        (key(KeyCode::Char('/')), Action::StartFilter),
        (key(KeyCode::Esc), Action::FilterClear),
        (key(KeyCode::Char('w')), Action::ToggleWarnings),
        (key(KeyCode::Enter), Action::ToggleHistory),
        (key(KeyCode::Char('?')), Action::ToggleHelp),
        (key(KeyCode::Char('q')), Action::Quit),
        (ctrl('c'), Action::Quit),
    ];
    for (k, action) in expected {
        assert_eq!(map_key(Mode::Normal, &k), Some(action), "{k:?}");
        let matching = BINDINGS
            .iter()
            .flat_map(|b| b.actions)
            .filter(|(matches, _)| matches(&k))
            .count();
        assert_eq!(matching, 1, "{k:?} matches {matching} table entries");
    }
    let entries: usize = BINDINGS.iter().map(|b| b.actions.len()).sum();
    assert_eq!(
        entries, 29,
        "a binding was added without a key in this test"
    );
    for unbound in [
        shift('K'),
        ctrl('q'),
        key(KeyCode::Char('x')),
        key(KeyCode::Char('z')),
    ] {
        assert_eq!(map_key(Mode::Normal, &unbound), None, "{unbound:?}");
    }
}

#[test]
fn every_replay_key_dispatches_and_none_is_a_live_binding() {
    let expected = [
        (key(KeyCode::Char(' ')), ReplayKey::TogglePlay),
        (key(KeyCode::Left), ReplayKey::Seek(false)),
        (key(KeyCode::Right), ReplayKey::Seek(true)),
        (key(KeyCode::Char('[')), ReplayKey::Spill(false)),
        (key(KeyCode::Char(']')), ReplayKey::Spill(true)),
        (key(KeyCode::Char('<')), ReplayKey::Edge(false)),
        (key(KeyCode::Char('>')), ReplayKey::Edge(true)),
        (key(KeyCode::Char('-')), ReplayKey::Speed(false)),
        (key(KeyCode::Char('+')), ReplayKey::Speed(true)),
        (key(KeyCode::Char('=')), ReplayKey::Speed(true)),
    ];
    for (k, replay_key) in expected {
        assert_eq!(map_replay_key(&k), Some(replay_key), "{k:?}");
        // The live table is tried after the replay's: a key in both would never act live.
        assert_eq!(map_key(Mode::Normal, &k), None, "{k:?} is also a live key");
    }
    let entries: usize = REPLAY_BINDINGS.iter().map(|b| b.actions.len()).sum();
    // `=` shares `+`'s entry.
    assert_eq!(entries, expected.len() - 1, "a replay key without a test");
    let ctrl_right = KeyEvent::new(KeyCode::Right, KeyModifiers::CONTROL);
    assert_eq!(map_replay_key(&ctrl_right), None);
    let writes: Vec<&str> = BINDINGS
        .iter()
        .filter(|b| b.writes())
        .map(|b| b.keys)
        .collect();
    assert_eq!(writes, ["g / G", "s / S", "c / C", "d / u"]);
}
