//! The trainer detail of an explained OOM: pattern, request and limit, the line that asked or
//! why it is unknown, what held the memory, why and what to do; and that the run went on.
//! The snapshots are drawn by `screens` and filed with the other screens'.

use super::super::app::rows::Column;
use super::super::app::state::{Action, App, Screen, Update};
use super::super::fixtures;
use super::{draw, screens, text, SIZES};
use crate::core::snapshot::Snapshot;

/// The trainer with the most severe finding, from the Processes screen.
const OPEN_TOP: [Action; 4] = [
    Action::Show(Screen::Processes),
    Action::SortBy(Column::Findings),
    Action::Top,
    Action::Open,
];

/// The second finding listed (the OOM, after the newer crash), from the Findings screen: its
/// trainer has ended, so only its finding leads to it.
const OPEN_SECOND_FINDING: [Action; 3] =
    [Action::Show(Screen::Findings), Action::Down, Action::Open];

#[test]
fn trainer_detail_explains_the_oom() {
    screens(
        "trainer_oom_fragmentation",
        fixtures::explained_fragmentation(),
        &OPEN_TOP,
    );
    screens(
        "trainer_oom_leak_no_line",
        fixtures::explained_leak(),
        &OPEN_SECOND_FINDING,
    );
    screens(
        "trainer_oom_survived_pressure",
        fixtures::survived_pressure(),
        &OPEN_TOP,
    );
    screens(
        "findings_oom_leak",
        fixtures::explained_leak(),
        &[Action::Show(Screen::Findings), Action::Down],
    );
    screens(
        "findings_oom_survived",
        fixtures::survived_pressure(),
        &[Action::Show(Screen::Findings)],
    );
}

/// `app` with its first node's snapshot changed by `change`, fed again as the source would.
fn changed(mut app: App, change: impl FnOnce(&mut Snapshot)) -> App {
    let mut s = app.nodes[0].snap.clone().unwrap();
    change(&mut s);
    app.update(Action::Data {
        node: 0,
        update: Update::Snapshot(Box::new(s)),
    });
    app
}

fn opened(mut app: App, actions: &[Action], w: u16, h: u16) -> String {
    for a in actions {
        app.update(a.clone());
    }
    text(&draw(&mut app, w, h))
}

/// What each explained OOM shows, at both sizes: the parts that must survive 80x24.
#[test]
fn the_explanation_reads_at_every_size() {
    for (w, h) in SIZES {
        let wide = w >= 120;
        let screen = opened(fixtures::explained_fragmentation(), &OPEN_TOP, w, h);
        let mut parts = vec![
            "▲ oom frag critical · firing since 3s ago",
            "why: 2.3 GiB of the cache was free, more than the 1.5 GiB asked, but its",
            "fix: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and keep tensor",
        ];
        parts.extend(if wide {
            [
                "OOM explained: fragmentation",
                "1.5 GiB asked at oomlib.py:37 in dev_big",
                "limit 4.00 GiB · allocated 1.3 GiB · reserved 3.6 GiB, 2.3 GiB of it free",
                "  95%    1.2 GiB  oomlib.py:32 dev_pin · 180 blocks",
                "   5%   65.0 MiB  oomlib.py:12 make_model · 3 blocks",
            ]
            .as_slice()
        } else {
            [
                "OOM fragmentation · 1.5 GiB asked at oomlib.py:37 in dev_big · limit 4.00 GiB",
                "live: 1.2 GiB (95%) at oomlib.py:32 in dev_pin · 1 more site",
            ]
            .as_slice()
        });
        for part in parts {
            assert!(screen.contains(part), "{w}x{h} {part:?}:\n{screen}");
        }
        // The remedy stands for the generic hint beside the explanation.
        assert!(!screen.contains("hint: "), "{w}x{h}:\n{screen}");

        let screen = opened(fixtures::explained_leak(), &OPEN_SECOND_FINDING, w, h);
        let unknown = if wide {
            "line unknown: no Python frame asked (raised inside torch, e.g. in backward)"
        } else {
            "OOM leak · 64.0 MiB asked · line unknown: no Python frame · limit 4.00 GiB"
        };
        let top = if wide {
            "  94%    3.6 GiB  oomlib.py:26 keep_output · 115 blocks"
        } else {
            "live: 3.6 GiB (94%) at oomlib.py:26 in keep_output"
        };
        for part in [
            "mlp-leak rank 0 · pid 4244",
            "▲ oom leak critical",
            unknown,
            top,
            "why: live memory is dominated by blocks allocated at oomlib.py:26 across 115",
            "fix: store loss.item() or loss.detach() at oomlib.py:26 instead of the tensor",
        ] {
            assert!(screen.contains(part), "{w}x{h} {part:?}:\n{screen}");
        }
        assert!(!screen.contains("survived"), "{w}x{h}:\n{screen}");

        let screen = opened(fixtures::survived_pressure(), &OPEN_TOP, w, h);
        for part in [
            "▲ oom pressure warning · firing since 12s ago · survived: the run went on",
            if wide {
                "9.0 GiB asked at oomlib.py:22 in project"
            } else {
                "OOM pressure · 9.0 GiB asked at oomlib.py:22 in project · limit 4.00 GiB"
            },
            "why: the 9.0 GiB request alone is larger than the 4.00 GiB allowed",
            "fix: lower the micro-batch and accumulate gradients, or use activation",
        ] {
            assert!(screen.contains(part), "{w}x{h} {part:?}:\n{screen}");
        }

        // The Findings list names the pattern; the selected one says the run went on.
        let screen = opened(
            fixtures::survived_pressure(),
            &[Action::Show(Screen::Findings)],
            w,
            h,
        );
        for part in [
            " ● oom pressure  warning  firing for 12s",
            "survived: the run went on (samples came after the OOM)",
            "fix: lower the micro-batch",
        ] {
            assert!(screen.contains(part), "{w}x{h} {part:?}:\n{screen}");
        }
    }
}

/// An explained OOM and a leak's sites on the same trainer: whichever finding is listed first
/// is shown, so a newer OOM takes the place of an older leak's attribution.
#[test]
fn the_first_listed_of_an_explained_oom_and_an_attributed_leak_is_shown() {
    use crate::core::detect::FindingState;
    let both = |oom_newer: bool| {
        let mut oom = fixtures::explained_leak().nodes[0].findings[0].clone();
        changed(fixtures::kept_outputs_leak(false), |s| {
            let leak = &s.findings[0];
            oom.subject = leak.subject.clone();
            oom.id = "s-3/oom".into();
            oom.state = FindingState::Firing;
            let at = leak.since.unwrap() + if oom_newer { 1.0 } else { -1.0 };
            (oom.first_ts, oom.since) = (at, Some(at));
            s.findings.push(oom);
        })
    };
    let open = [
        Action::Show(Screen::Processes),
        Action::SortBy(Column::Findings),
        Action::Top,
        Action::Open,
    ];
    for (w, h) in SIZES {
        let screen = opened(both(true), &open, w, h);
        assert!(screen.contains("oomlib.py:26"), "{w}x{h}:\n{screen}");
        assert!(!screen.contains("Allocated at"), "{w}x{h}:\n{screen}");
        let screen = opened(both(false), &open, w, h);
        assert!(
            screen.contains("Allocated at · 120.0 MiB grew in steps 813–873"),
            "{w}x{h}:\n{screen}"
        );
        assert!(
            !screen.contains("OOM leak ·") && !screen.contains("OOM explained"),
            "{w}x{h}:\n{screen}"
        );
    }
}

/// Strings from a trainer reach the terminal with their control characters escaped, not
/// dropped (which left the rest of each sequence drawn), wherever the explanation puts them.
#[test]
fn control_characters_from_the_trainer_never_reach_the_terminal() {
    let hostile = "x\u{1b}[2J\u{1b}]0;owned\u{7}\r\n\u{8}\u{9b}y";
    for (w, h) in SIZES {
        let app = changed(fixtures::explained_fragmentation(), |s| {
            let e = s.findings[0].evidence.explanation.as_mut().unwrap();
            let fs = e.failing_site.as_mut().unwrap();
            fs.file = format!("/p/{hostile}.py");
            fs.function = hostile.into();
            for site in &mut e.live_sites {
                site.function = hostile.into();
                for fr in &mut site.stack {
                    fr.function = hostile.into();
                }
            }
            e.reasons = vec![hostile.into()];
            e.remedies = vec![hostile.into()];
        });
        for actions in [&OPEN_TOP[..], &[Action::Show(Screen::Findings)][..]] {
            let mut app = app.clone();
            for a in actions {
                app.update(a.clone());
            }
            let t = draw(&mut app, w, h);
            let cells = t.backend().buffer().content();
            let bad: Vec<&str> = cells
                .iter()
                .map(|c| c.symbol())
                .filter(|s| s.chars().any(char::is_control))
                .collect();
            assert!(bad.is_empty(), "{w}x{h}: {bad:?}\n{}", text(&t));
            // Shown escaped, and no residue of a dropped one.
            let shown = text(&t);
            assert!(
                shown.contains("x\\u{1b}[2J\\u{1b}]0;owned"),
                "{w}x{h}:\n{shown}"
            );
            assert!(!shown.contains("x[2J"), "{w}x{h}:\n{shown}");
        }
    }
}
