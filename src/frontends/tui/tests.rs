//! Snapshot tests of every screen at 80x24 and 160x48 from fixture states, plus the behaviour
//! of actions, input mapping and the event loop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::app::rows::Column;
use super::app::state::{Action, App, Screen};
use super::fixtures;
use super::ui;

mod categories;
mod first_look;
mod input;
mod jobs;
mod oom;
mod sites;

const SIZES: [(u16, u16); 2] = [(80, 24), (160, 48)];

fn draw(app: &mut App, w: u16, h: u16) -> Terminal<TestBackend> {
    app.update(Action::Resize {
        width: w,
        height: h,
    });
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| ui::render(f, app)).unwrap();
    t
}

fn text(t: &Terminal<TestBackend>) -> String {
    t.backend().to_string()
}

/// Snapshots `app` after `actions` at both sizes.
fn screens(name: &str, app: App, actions: &[Action]) {
    screens_at(name, app, actions, &SIZES);
}

fn screens_at(name: &str, mut app: App, actions: &[Action], sizes: &[(u16, u16)]) {
    for a in actions {
        app.update(a.clone());
    }
    for &(w, h) in sizes {
        let t = draw(&mut app, w, h);
        insta::assert_snapshot!(format!("{name}_{w}x{h}"), t.backend());
    }
}

#[test]
fn overview_screens() {
    screens("overview_healthy", fixtures::healthy(), &[]);
    screens("overview_no_gpus", fixtures::no_gpus(), &[]);
    screens("overview_nvml_down", fixtures::nvml_down(), &[]);
    screens("overview_firing_leak", fixtures::firing_leak(), &[]);
    screens("overview_disconnected", fixtures::disconnected(), &[]);
    screens("overview_in_process", fixtures::in_process(), &[]);
    screens("overview_multi_node", fixtures::multi_node(), &[]);
    screens("overview_largest", fixtures::largest(), &[]);
}

#[test]
fn processes_screens() {
    let show = Action::Show(Screen::Processes);
    screens(
        "processes_firing_leak",
        fixtures::firing_leak(),
        std::slice::from_ref(&show),
    );
    screens(
        "processes_100",
        fixtures::hundred_processes(),
        std::slice::from_ref(&show),
    );
    screens(
        "processes_multi_node",
        fixtures::multi_node(),
        std::slice::from_ref(&show),
    );
    screens(
        "processes_disconnected",
        fixtures::disconnected(),
        std::slice::from_ref(&show),
    );
    let mut filter = vec![show.clone(), Action::FilterStart];
    filter.extend("torchrun".chars().map(Action::FilterInput));
    filter.push(Action::SortBy(Column::Used));
    screens(
        "processes_100_filtered",
        fixtures::hundred_processes(),
        &filter,
    );
}

#[test]
fn trainer_detail_screens() {
    let open_leak = [
        Action::Show(Screen::Processes),
        Action::SortBy(Column::Findings),
        Action::Top,
        Action::Open,
    ];
    screens("trainer_firing_leak", fixtures::firing_leak(), &open_leak);
    let open_xorg = [
        Action::Show(Screen::Processes),
        Action::Bottom,
        Action::Open,
    ];
    screens("process_not_instrumented", fixtures::healthy(), &open_xorg);
}

#[test]
fn findings_screens() {
    let show = [Action::Show(Screen::Findings)];
    screens("findings_firing_leak", fixtures::firing_leak(), &show);
    screens("findings_none", fixtures::healthy(), &show);
    screens("findings_in_process", fixtures::in_process(), &show);
    screens("findings_multi_node", fixtures::multi_node(), &show);
}

/// At 80x24 the Selected pane keeps the hint's remedy (what to do), not only its explanation,
/// however long the message above it.
#[test]
fn the_80x24_findings_pane_shows_the_remedy() {
    let mut app = fixtures::firing_leak_worded();
    app.update(Action::Show(Screen::Findings));
    app.update(Action::Down);
    let screen = text(&draw(&mut app, 80, 24));
    let pane = screen.split(" Selected ").nth(1).unwrap();
    assert!(pane.contains("● leak"), "{screen}");
    for words in ["hint:", "`loss.item()`", "`loss.detach()`", "instead"] {
        assert!(pane.contains(words), "{words} is cut:\n{screen}");
    }
    screens_at(
        "findings_leak_selected",
        fixtures::firing_leak_worded(),
        &[Action::Show(Screen::Findings), Action::Down],
        &SIZES,
    );
}

#[test]
fn help_overlay() {
    screens("help", fixtures::healthy(), &[Action::ToggleHelp]);
    screens(
        "help_words",
        fixtures::healthy(),
        &[Action::ToggleHelp, Action::HelpPage],
    );
}

/// Every column title and header word the screens abbreviate is on the help's second page, at
/// 80x24: none is left for the user to guess.
#[test]
fn every_column_and_header_word_is_explained_in_the_help() {
    let mut app = fixtures::firing_leak();
    app.update(Action::ToggleHelp);
    app.update(Action::HelpPage);
    let page = text(&draw(&mut app, 80, 24));
    let mut words: Vec<&str> = Column::ALL
        .iter()
        .filter(|c| {
            !matches!(
                c,
                Column::Node | Column::Gpu | Column::User | Column::Container
            )
        })
        .map(|c| c.title())
        .filter(|t| *t != "PROCESS / JOB")
        .collect();
    words.extend([
        "r0/8", "conns", "rejected", "unsent", "outside", "near", "frag",
    ]);
    for w in words {
        assert!(
            page.contains(w),
            "{w} is not explained in the help:\n{page}"
        );
    }
    // The header says what the help explains: replies not sent, not "dropped" trainer lines.
    app.update(Action::HelpPage);
    assert!(!app.help, "past the last page the help closes");
    let screen = text(&draw(&mut app, 80, 24));
    assert!(screen.contains("0 unsent"), "{screen}");
    assert!(!screen.contains("dropped"), "{screen}");
    assert_eq!(super::app::state::HELP_PAGES, ui::help::PAGES.len());
    // Every line of the help fits its overlay whole: none is cut mid-word.
    for (_, rows) in ui::help::PAGES {
        for (key, what) in rows {
            assert!(key.chars().count() <= 16, "{key}");
            assert!(what.chars().count() <= ui::help::MEANING, "{what}");
        }
    }
}

#[test]
fn no_color_means_no_colour_anywhere() {
    use ratatui::style::Color;
    let screens = [
        vec![],
        vec![Action::Show(Screen::Processes)],
        vec![Action::Show(Screen::Findings)],
        vec![
            Action::Show(Screen::Processes),
            Action::SortBy(Column::Findings),
            Action::Top,
            Action::Open,
        ],
        vec![Action::ToggleHelp],
    ];
    for color in [true, false] {
        let mut coloured = 0;
        for actions in &screens {
            // The leak with sites, callers and notes: every part of the trainer view is drawn.
            let mut app = fixtures::eval_graph_leak();
            app.color = color;
            for a in actions {
                app.update(a.clone());
            }
            let t = draw(&mut app, 160, 48);
            coloured += t
                .backend()
                .buffer()
                .content()
                .iter()
                .filter(|c| c.fg != Color::Reset || c.bg != Color::Reset)
                .count();
        }
        assert_eq!(
            coloured > 0,
            color,
            "colour={color}: {coloured} coloured cells"
        );
    }
}

#[test]
fn sorting_filtering_and_selection_follow_the_rows() {
    let mut app = fixtures::firing_leak();
    app.update(Action::Show(Screen::Processes));
    app.update(Action::SortBy(Column::Used));
    let used: Vec<_> = app
        .procs
        .view
        .iter()
        .map(|i| app.procs.rows[*i].used)
        .collect();
    assert_eq!(
        used.first(),
        Some(&Some(40 << 30)),
        "largest first: {used:?}"
    );
    app.update(Action::SortBy(Column::Used));
    let first = app.procs.rows[app.procs.view[0]].key.pid;
    assert_eq!(first, 5001, "ascending puts Xorg's 16 MiB first");
    assert_eq!(
        app.procs.selected_row().unwrap().key.pid,
        4242,
        "selection kept"
    );
    // Select pid 5000, then a refresh in which it moves: the selection moves with it.
    while app.procs.selected_row().unwrap().key.pid != 5000 {
        assert!(app.update(Action::Down));
    }
    let mut s = fixtures::snapshot(
        "gpu-node-1",
        vec![fixtures::gpu(0, 50 << 30), fixtures::gpu(1, 1 << 30)],
        vec![
            fixtures::process(1, 5000, "python", "carol", 1 << 20),
            fixtures::process(0, 4242, "python", "alice", 9 << 30),
        ],
        vec![],
        vec![],
    );
    s.ts += 1.0;
    app.update(Action::Data {
        node: 0,
        update: super::app::state::Update::Snapshot(Box::new(s)),
    });
    assert_eq!(app.procs.selected_row().unwrap().key.pid, 5000);
    assert_eq!(app.procs.selected, 0, "now the smallest");
    app.update(Action::FilterStart);
    for c in "ALICE".chars() {
        app.update(Action::FilterInput(c));
    }
    assert_eq!(
        app.procs.view.len(),
        1,
        "case-insensitive match on the user"
    );
    app.update(Action::FilterCancel);
    assert_eq!(app.procs.view.len(), 2);
    assert!(!app.procs.editing);
}

#[test]
fn history_merges_without_duplicates_and_keeps_gaps() {
    let mut app = fixtures::healthy();
    let uuid = app.nodes[0].snap.as_ref().unwrap().gpus[0]
        .reading
        .identity
        .uuid
        .clone();
    let before = app.nodes[0].history[&uuid].len();
    assert_eq!(before, 300);
    // The same five minutes again plus one new point, and then a snapshot without history.
    let mut again = fixtures::snapshot(
        "gpu-node-1",
        vec![fixtures::gpu(0, 1 << 30)],
        vec![],
        vec![],
        vec![],
    );
    let mut gap = again.gpus[0].history[299];
    gap.ts += 1.0;
    gap.value = None;
    again.gpus[0].history.push(gap);
    again.ts += 1.0;
    let mut later = again.clone();
    later.gpus[0].history.clear();
    later.ts += 1.0;
    for s in [again, later] {
        app.update(Action::Data {
            node: 0,
            update: super::app::state::Update::Snapshot(Box::new(s)),
        });
    }
    let h = &app.nodes[0].history[&uuid];
    assert_eq!(h.len(), 300, "trimmed to five minutes: {}", h.len());
    let tail: Vec<_> = h.iter().rev().take(2).map(|(_, v)| *v).collect();
    assert_eq!(
        tail,
        vec![Some(1 << 30), None],
        "the gap is kept, then the live point"
    );
    assert!(h.iter().zip(h.iter().skip(1)).all(|(a, b)| a.0 < b.0));
    assert_eq!(app.nodes[0].history.len(), 1, "GPU 1 is gone");
}

#[test]
fn a_daemon_that_goes_away_and_comes_back() {
    let mut app = fixtures::disconnected();
    let t = draw(&mut app, 80, 24);
    assert!(text(&t).contains("DISCONNECTED for 41s"), "{}", text(&t));
    assert!(
        text(&t).contains("retrying in 8s (attempt 4)"),
        "{}",
        text(&t)
    );
    assert!(text(&t).contains("stale"), "the last data is marked stale");
    let mut s = fixtures::snapshot(
        "gpu-node-1",
        vec![fixtures::gpu(0, 1 << 30)],
        vec![],
        vec![],
        vec![],
    );
    s.ts += 60.0;
    app.update(Action::Data {
        node: 0,
        update: super::app::state::Update::Snapshot(Box::new(s)),
    });
    let t = draw(&mut app, 80, 24);
    assert!(!text(&t).contains("DISCONNECTED"), "{}", text(&t));
    assert!(!text(&t).contains("stale"));
}

#[test]
fn resize_keeps_the_selection_visible_and_tiny_terminals_get_a_notice() {
    let mut app = fixtures::hundred_processes();
    app.update(Action::Resize {
        width: 160,
        height: 48,
    });
    app.update(Action::Show(Screen::Processes));
    for _ in 0..40 {
        app.update(Action::Down);
    }
    assert_eq!(app.procs.selected, 40);
    app.update(Action::Resize {
        width: 80,
        height: 24,
    });
    let rows = super::geometry::table_rows(80, 24);
    let (o, s) = (app.procs.offset, app.procs.selected);
    assert!(
        o <= s && s < o + rows,
        "offset {o}, selected {s}, rows {rows}"
    );
    let t = draw(&mut app, 80, 24);
    assert!(text(&t).contains("▶"));
    let t = draw(&mut app, 30, 8);
    assert!(
        text(&t).contains("Terminal too small (30x8)"),
        "{}",
        text(&t)
    );
}
