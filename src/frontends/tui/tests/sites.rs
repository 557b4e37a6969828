//! The trainer detail's attribution: sites, callers and notes, an error answer, an open request.
//! The snapshots are drawn by `screens` and filed with the other screens'.

use super::super::app::rows::Column;
use super::super::app::state::{Action, App, Screen};
use super::super::fixtures;
use super::{draw, screens, text, SIZES};

const OPEN_LEAK: [Action; 4] = [
    Action::Show(Screen::Processes),
    Action::SortBy(Column::Findings),
    Action::Top,
    Action::Open,
];

#[test]
fn trainer_detail_lists_where_the_leak_is_allocated() {
    screens(
        "trainer_attributed_leak",
        fixtures::kept_outputs_leak(false),
        &OPEN_LEAK,
    );
    screens("trainer_two_sites", fixtures::eval_graph_leak(), &OPEN_LEAK);
    screens(
        "trainer_attribution_unavailable",
        fixtures::unavailable_leak(),
        &OPEN_LEAK,
    );
    screens(
        "trainer_attribution_asking",
        fixtures::asking_leak(),
        &OPEN_LEAK,
    );
}

fn opened(mut app: App, w: u16, h: u16) -> String {
    for a in &OPEN_LEAK {
        app.update(a.clone());
    }
    text(&draw(&mut app, w, h))
}

/// The sites read at both sizes, whichever of the finding or the session carries them; an error
/// answer says why there are none; an open request says the trainer is being asked.
#[test]
fn sites_show_share_bytes_place_and_function_at_every_size() {
    for (w, h) in SIZES {
        for session_only in [false, true] {
            let screen = opened(fixtures::kept_outputs_leak(session_only), w, h);
            assert!(
                screen.contains("Allocated at · 120.0 MiB grew in steps 813\u{2013}873"),
                "{w}x{h}:\n{screen}"
            );
            assert!(
                screen.contains(" 100%  120.0 MiB  train.py:27 kept_outputs"),
                "{w}x{h}:\n{screen}"
            );
            // Callers and block counts only where there is room.
            let wide = w >= 120;
            assert_eq!(
                screen.contains("← train.py:48 in run"),
                wide,
                "{w}x{h}:\n{screen}"
            );
            assert_eq!(screen.contains("120 blocks"), wide, "{w}x{h}:\n{screen}");
        }
        let screen = opened(fixtures::unavailable_leak(), w, h);
        assert!(
            screen.contains("attribution unavailable: torch.cuda is not available"),
            "{w}x{h}:\n{screen}"
        );
        let screen = opened(fixtures::asking_leak(), w, h);
        assert!(
            screen.contains("Asking the trainer where the growth is allocated… (asked 30s ago)"),
            "{w}x{h}:\n{screen}"
        );
        assert!(!screen.contains("Allocated at"), "{w}x{h}:\n{screen}");
    }
    let wide = opened(fixtures::eval_graph_leak(), 160, 48);
    for part in [
        "  50%   24.0 MiB  train.py:34 eval_without_no_grad · 96 blocks",
        "  50%   24.0 MiB  train.py:47 run · 24 blocks",
        "grows in step with train.py:47 (96 blocks here, 24 there)",
    ] {
        assert!(wide.contains(part), "{part:?}:\n{wide}");
    }
}

/// An armed trainer near its limit: the near_limit finding's step peak is listed where a leak's
/// sites are, largest first, with its share of the peak.
#[test]
fn trainer_detail_lists_what_was_live_at_the_step_peak() {
    screens(
        "trainer_near_limit_peak",
        fixtures::near_limit_peak(),
        &OPEN_LEAK,
    );
    for (w, h) in SIZES {
        let screen = opened(fixtures::near_limit_peak(), w, h);
        assert!(
            screen.contains("Live at the step peak · 3.8 GiB in steps 880\u{2013}900"),
            "{w}x{h}:\n{screen}"
        );
        assert!(
            screen.contains("  52%    2.0 GiB  model.py:88 attention"),
            "{w}x{h}:\n{screen}"
        );
        assert_eq!(
            screen.contains("← model.py:140 in forward"),
            w >= 120,
            "{w}x{h}:\n{screen}"
        );
    }
}
