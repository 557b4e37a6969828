//! The trainer detail's memory split: the bar and its sizes, the batch that fits, the partial
//! reasons. The snapshots are drawn by `screens` and filed with the other screens'.

use super::super::app::rows::Column;
use super::super::app::state::{Action, App, Screen};
use super::super::fixtures;
use super::{draw, screens, screens_at, text, SIZES};

/// The only process of the fixtures' node, opened.
const OPEN: [Action; 3] = [Action::Show(Screen::Processes), Action::Top, Action::Open];

fn opened(mut app: App, w: u16, h: u16) -> String {
    for a in &OPEN {
        app.update(a.clone());
    }
    text(&draw(&mut app, w, h))
}

#[test]
fn trainer_detail_draws_the_split_at_the_peak() {
    screens(
        "trainer_split_proportional",
        fixtures::split_proportional(),
        &OPEN,
    );
    screens("trainer_split_fitted", fixtures::split_fitted(), &OPEN);
    screens("trainer_split_partial", fixtures::split_partial(), &OPEN);
    // Narrow: the bar goes on a line of its own, the sizes below it with short names.
    screens_at(
        "trainer_split_narrow",
        fixtures::split_proportional(),
        &OPEN,
        &[(60, 30)],
    );
}

#[test]
fn the_split_reads_at_every_size() {
    for (w, h) in SIZES {
        let screen = opened(fixtures::split_proportional(), w, h);
        assert!(
            screen.contains("split at step 1,500, peak 18.0 GiB"),
            "{w}x{h}:\n{screen}"
        );
        assert!(
            screen.contains("batch 16 now · 15 fits (scaled from batch 16)"),
            "{w}x{h}:\n{screen}"
        );
        for part in [
            "3.0 GiB", "6.0 GiB", "4.5 GiB", "1.5 GiB", "█", "▓", "▒", "░", "▪",
        ] {
            assert!(screen.contains(part), "{part:?} at {w}x{h}:\n{screen}");
        }
        let screen = opened(fixtures::split_fitted(), w, h);
        assert!(
            screen.contains(" fits (fitted on batches 8, 12 and 16, within 5%)"),
            "{w}x{h}:\n{screen}"
        );
        assert!(screen.contains("64.0 MiB"), "buffers at {w}x{h}:\n{screen}");
        let screen = opened(fixtures::split_partial(), w, h);
        assert!(screen.contains("partial: "), "{w}x{h}:\n{screen}");
        assert!(!screen.contains("batch "), "{w}x{h}:\n{screen}");
    }
    let wide = opened(fixtures::split_proportional(), 160, 48);
    assert!(
        wide.contains("█ parameters 3.0 GiB  ▓ gradients 3.0 GiB  ▒ optimizer state 6.0 GiB"),
        "{wide}"
    );
}

/// A trainer that sent no split draws nothing of one.
#[test]
fn no_split_draws_nothing() {
    for (w, h) in SIZES {
        let mut app = fixtures::firing_leak();
        for a in [
            Action::Show(Screen::Processes),
            Action::SortBy(Column::Findings),
            Action::Top,
            Action::Open,
        ] {
            app.update(a);
        }
        let screen = text(&draw(&mut app, w, h));
        assert!(screen.contains("llama-ft rank 0"), "{w}x{h}:\n{screen}");
        assert!(!screen.contains("split at step"), "{w}x{h}:\n{screen}");
    }
}
