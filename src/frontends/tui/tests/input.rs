//! Keys and mouse to actions by mode, and the event loop: when it draws, when it stops.

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::super::app::rows::Column;
use super::super::app::state::{Action, Screen};
use super::super::fixtures;
use super::text;

#[test]
fn keys_and_mouse_map_to_actions_by_mode() {
    use super::super::app::input::action;
    use crossterm::event::{
        Event, KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
    };
    let key = |c: KeyCode| Event::Key(KeyEvent::new(c, KeyModifiers::NONE));
    let click = |x: u16, y: u16| {
        Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: x,
            row: y,
            modifiers: KeyModifiers::NONE,
        })
    };
    let mut app = fixtures::firing_leak();
    app.update(Action::Resize {
        width: 80,
        height: 24,
    });
    assert!(matches!(
        action(&app, &key(KeyCode::Char('q'))),
        Some(Action::Quit)
    ));
    assert!(matches!(
        action(&app, &key(KeyCode::Char('j'))),
        Some(Action::Down)
    ));
    assert!(action(&app, &key(KeyCode::F(5))).is_none());
    let ctrl_c = Event::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    // Tabs: " 1 Overview " starts at 0, " 2 Processes " at 13.
    assert!(matches!(
        action(&app, &click(15, 2)),
        Some(Action::Show(Screen::Processes))
    ));
    app.update(Action::Show(Screen::Processes));
    // Column titles on row 4 (body at 3, border, then the header); rows from 5.
    assert!(matches!(
        action(&app, &click(3, 4)),
        Some(Action::SortBy(Column::Gpu))
    ));
    assert!(matches!(
        action(&app, &click(10, 6)),
        Some(Action::Select(1))
    ));
    app.update(Action::Select(1));
    assert_eq!(app.procs.selected, 1);
    app.update(Action::Select(1));
    assert!(
        app.detail.is_some(),
        "a second click on the selected row opens it"
    );
    assert!(matches!(
        action(&app, &key(KeyCode::Char('h'))),
        Some(Action::Back)
    ));
    app.update(Action::Back);
    app.update(Action::FilterStart);
    assert!(matches!(
        action(&app, &key(KeyCode::Char('q'))),
        Some(Action::FilterInput('q'))
    ));
    assert!(matches!(action(&app, &ctrl_c), Some(Action::Quit)));
    app.update(Action::FilterApply);
    app.update(Action::ToggleHelp);
    assert!(matches!(
        action(&app, &key(KeyCode::Char('j'))),
        Some(Action::ToggleHelp)
    ));
    assert!(matches!(
        action(&app, &click(1, 1)),
        Some(Action::ToggleHelp)
    ));
    assert!(matches!(
        action(&app, &key(KeyCode::Char('?'))),
        Some(Action::HelpPage)
    ));
}

#[test]
fn the_loop_draws_only_for_input_or_data_and_stops_on_quit_or_signal() {
    use super::super::event_loop::{run, Exit};
    use super::super::Msg;
    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
    use std::time::Duration;
    let key = |c: KeyCode| Msg::Input(Event::Key(KeyEvent::new(c, KeyModifiers::NONE)));

    let mut app = fixtures::firing_leak();
    app.update(Action::Resize {
        width: 80,
        height: 24,
    });
    let mut term = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        // Idle, an unmapped key, then a real one: two frames in all, however they are batched.
        std::thread::sleep(Duration::from_millis(300));
        tx.send(key(KeyCode::F(5))).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        tx.send(key(KeyCode::Tab)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        tx.send(key(KeyCode::Char('q'))).unwrap();
        tx.send(key(KeyCode::Tab)).unwrap();
    });
    let out = run(&mut term, &mut app, &rx).unwrap();
    sender.join().unwrap();
    assert_eq!(out.exit, Exit::Quit);
    assert_eq!(out.frames, 2);
    assert_eq!(
        app.screen,
        Screen::Processes,
        "the Tab after q was not applied"
    );
    assert!(text(&term).contains("Processes 4 of 4"));

    let (tx, rx) = std::sync::mpsc::channel();
    tx.send(Msg::Signal(15)).unwrap();
    let out = run(&mut term, &mut app, &rx).unwrap();
    assert_eq!(out.exit, Exit::Signal(15));
    drop(tx);
    let out = run(&mut term, &mut app, &rx).unwrap();
    assert_eq!(out.exit, Exit::Closed);
}
