#![allow(clippy::unwrap_used)]
use super::*;
use crate::frontends::tui::app::state::App;
use crate::frontends::tui::fixtures;

/// The demo's table drawn alone into `w`x`h`.
fn drawn(w: u16, h: u16) -> String {
    drawn_of(&fixtures::demo_like(), w, h)
}

/// `app`'s table drawn alone into `w`x`h`.
fn drawn_of(app: &App, w: u16, h: u16) -> String {
    let backend = ratatui::backend::TestBackend::new(w, h);
    let mut term = ratatui::Terminal::new(backend).unwrap();
    term.draw(|f| trainers(f, f.area(), app, Theme::new(false)))
        .unwrap();
    term.backend().to_string()
}

#[test]
fn cut_rows_and_no_room_say_where_the_trainers_are() {
    let five = drawn(80, 5);
    assert!(five.contains("demo-leak r0/1"), "{five}");
    assert!(five.contains(" 2 more: 2 Processes lists them "), "{five}");
    let three = drawn(80, 3);
    assert!(
        three.contains(" 4 trainers (3 with findings): 2 Processes lists them"),
        "{three}"
    );
}

fn total(cols: &[(Column, usize)]) -> usize {
    cols.iter().map(|(_, w)| w).sum::<usize>() + cols.len() - 1
}

#[test]
fn the_name_and_the_findings_come_first_and_share_what_is_left() {
    // 80 columns, the demo's longest name: whole, beside its badges and the memory.
    let cols = columns(78, 29, 4, false);
    let shown: Vec<Column> = cols.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        shown,
        [
            Column::Name,
            Column::Gpu,
            Column::Floor,
            Column::Peak,
            Column::Reserved,
            Column::Findings
        ]
    );
    assert_eq!(cols[0], (Column::Name, 29));
    assert_eq!(total(&cols), 78);
    // 120 and 160: every column, the name whole, the rest to the findings.
    for room in [118, 158] {
        let cols = columns(room, 29, 9, false);
        assert_eq!(cols.len(), SHOWN.len() - 1);
        assert_eq!(cols[0], (Column::Name, 29));
        assert_eq!(total(&cols), room);
    }
    // A very long name is cut near half the room, not the findings.
    let cols = columns(78, 200, 9, false);
    assert_eq!(cols[0], (Column::Name, 41));
    assert_eq!(cols.last(), Some(&(Column::Findings, 9)));
    assert!(total(&cols) <= 78);
    // Narrowest terminal: still both.
    let cols = columns(38, 29, 4, false);
    assert_eq!(cols[0].0, Column::Name);
    assert_eq!(cols.last().map(|c| c.0), Some(Column::Findings));
    assert!(total(&cols) <= 38, "{cols:?}");
}

#[test]
fn a_job_s_lines_come_before_its_ranks_and_a_cut_says_what_is_below() {
    let app = fixtures::leaking_job();
    let (lines, hot) = live(&app);
    // Titles, the job's 3 lines, its 8 ranks: all of them about the leak.
    assert_eq!((lines, hot), (12, 11));
    let eight = drawn_of(&app, 80, 8);
    assert!(
        eight.contains("│■ llama-70b (run run-4128) · 8/8 ranks · running"),
        "{eight}"
    );
    assert!(eight.contains("│  llama-70b r0/8 · python"), "{eight}");
    assert!(
        eight.contains(" 6 more: 2 Processes lists them "),
        "{eight}"
    );
    let failed = fixtures::failed_job();
    // No trainer is left to list: no column titles, only the job's lines.
    assert_eq!(live(&failed), (5, 5));
    let three = drawn_of(&failed, 80, 3);
    assert!(
        three.contains(" 0 trainers (0 with findings), 1 job failed: 2 Processes lists them"),
        "{three}"
    );
}

/// Names are measured in cells, not characters: after a wide (CJK) name, or one with combining
/// marks, the columns start where they start on every other row.
#[test]
fn wide_and_combining_names_keep_the_columns_aligned() {
    use crate::frontends::tui::app::state::{Action, Update};
    let mut app = fixtures::demo_like();
    let mut s = app.nodes[0].snap.clone().unwrap();
    s.sessions[0].job = Some("训练-日本語-モデル".into());
    s.sessions[1].job = Some("cafe\u{301}-e\u{301}te\u{301}".into());
    app.update(Action::Data {
        node: 0,
        update: Update::Snapshot(Box::new(s)),
    });
    for w in [80, 120, 160] {
        let shown = drawn_of(&app, w, 8);
        assert!(shown.contains("训练-日本語-モデル"), "{shown}");
        // Where each row's FLOOR figure ends, in cells.
        let ends: Vec<usize> = shown
            .lines()
            .filter(|l| l.contains(" r0/1"))
            .map(|l| {
                let at = l.find("iB").unwrap_or_else(|| panic!("{w}: {l}"));
                ratatui::text::Span::raw(&l[..at]).width()
            })
            .collect();
        assert_eq!(ends.len(), 4, "{w}:\n{shown}");
        assert!(ends.iter().all(|e| *e == ends[0]), "{w}: {ends:?}\n{shown}");
    }
}
