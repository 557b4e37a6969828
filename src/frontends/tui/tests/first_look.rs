//! What the first look at the demo's node answers at 80x24, 120x40 and 160x48: on the
//! Overview, which trainer has a problem and what it is; on Findings, the line that allocated
//! the leak. The snapshots are drawn by `screens_at` and filed with the other screens'.

use super::super::app::state::{Action, Screen};
use super::super::fixtures;
use super::{draw, screens_at, text};

const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (160, 48)];

/// The demo's trainers and their badges: each pair on one line of the Overview.
const BADGED: [(&str, &str); 3] = [
    ("demo-leak r0/1", " leak"),
    ("demo-near-limit r0/1", " near"),
    ("demo-untracked r0/1", " outside"),
];

#[test]
fn first_look_snapshots() {
    screens_at("first_look_overview", fixtures::demo_like(), &[], &SIZES);
    let findings = [Action::Show(Screen::Findings)];
    screens_at(
        "first_look_findings",
        fixtures::demo_like(),
        &findings,
        &SIZES,
    );
}

#[test]
fn the_overview_names_each_trainer_with_its_badge_at_every_size() {
    let mut app = fixtures::demo_like();
    for (w, h) in SIZES {
        let screen = text(&draw(&mut app, w, h));
        for (name, badge) in BADGED {
            assert!(
                screen
                    .lines()
                    .any(|l| l.contains(name) && l.contains(badge)),
                "{name} with{badge} at {w}x{h}:\n{screen}"
            );
        }
        assert!(screen.contains("demo-healthy"), "{w}x{h}:\n{screen}");
    }
}

#[test]
fn findings_keep_the_line_that_allocated_the_leak_at_every_size() {
    let mut app = fixtures::demo_like();
    app.update(Action::Show(Screen::Findings));
    for (w, h) in SIZES {
        let screen = text(&draw(&mut app, w, h));
        // On the list itself, not only in the selected one's pane.
        let listed = screen.split(" Selected ").next().unwrap_or_default();
        assert!(
            listed.contains(" at train.py:27 in kept_outputs"),
            "{w}x{h}:\n{screen}"
        );
    }
}
