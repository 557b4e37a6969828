//! Keys and mouse events to actions. Pure: it reads the state to know the mode (help open,
//! filter being typed, detail open) and where things are drawn, and changes nothing.

use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::Rect;

use super::state::{Action, App, Screen};
use crate::frontends::tui::geometry;
use crate::frontends::tui::ui::layout;

pub fn action(app: &App, ev: &Event) -> Option<Action> {
    match ev {
        Event::Key(k) if k.kind != KeyEventKind::Release => key(app, k),
        Event::Mouse(m) => mouse(app, m),
        Event::Resize(width, height) => Some(Action::Resize {
            width: *width,
            height: *height,
        }),
        _ => None,
    }
}

fn key(app: &App, k: &KeyEvent) -> Option<Action> {
    let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(k.code, KeyCode::Char('c')) {
        return Some(Action::Quit);
    }
    if app.procs.editing {
        return Some(match k.code {
            KeyCode::Esc => Action::FilterCancel,
            KeyCode::Enter => Action::FilterApply,
            KeyCode::Backspace => Action::FilterBackspace,
            KeyCode::Up => Action::Up,
            KeyCode::Down => Action::Down,
            KeyCode::Char(c) if !ctrl => Action::FilterInput(c),
            _ => return None,
        });
    }
    if app.help {
        return Some(match k.code {
            KeyCode::Char('q') => Action::Quit,
            KeyCode::Char('?' | ' ') | KeyCode::PageDown | KeyCode::Tab => Action::HelpPage,
            _ => Action::ToggleHelp,
        });
    }
    let detail = app.detail.is_some();
    Some(match k.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') => Action::ToggleHelp,
        KeyCode::Tab => Action::NextScreen,
        KeyCode::BackTab => Action::PrevScreen,
        KeyCode::Esc | KeyCode::Backspace => Action::Back,
        KeyCode::Left | KeyCode::Char('h') if detail => Action::Back,
        KeyCode::Right | KeyCode::Char('l') => Action::NextScreen,
        KeyCode::Left | KeyCode::Char('h') => Action::PrevScreen,
        KeyCode::Char('1') => Action::Show(Screen::Overview),
        KeyCode::Char('2') => Action::Show(Screen::Processes),
        KeyCode::Char('3') => Action::Show(Screen::Findings),
        KeyCode::Char('d' | 'f') if ctrl => Action::PageDown,
        KeyCode::Char('u' | 'b') if ctrl => Action::PageUp,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::Home | KeyCode::Char('g') => Action::Top,
        KeyCode::End | KeyCode::Char('G') => Action::Bottom,
        KeyCode::Enter => Action::Open,
        KeyCode::Char('s') => Action::SortNext,
        KeyCode::Char('S' | 'r') => Action::SortReverse,
        KeyCode::Char('/') => Action::FilterStart,
        KeyCode::Char('z') => Action::ToggleZoom,
        _ => return None,
    })
}

fn mouse(app: &App, m: &MouseEvent) -> Option<Action> {
    match m.kind {
        MouseEventKind::ScrollDown => return Some(Action::Down),
        MouseEventKind::ScrollUp => return Some(Action::Up),
        MouseEventKind::Down(MouseButton::Left) => {}
        _ => return None,
    }
    if app.help {
        return Some(Action::ToggleHelp);
    }
    let a = geometry::areas(Rect::new(0, 0, app.width, app.height));
    let (x, y) = (m.column, m.row);
    if y == a.tabs.y {
        return layout::tab_at(app, x).map(Action::Show);
    }
    if app.detail.is_some() {
        return None;
    }
    match app.screen {
        Screen::Processes => {
            let (head, rows) = geometry::table(a.body);
            let inside = x >= head.x && x < head.x + head.width;
            if y == head.y && inside {
                layout::column_at(x - head.x, head.width, app.multi_node()).map(Action::SortBy)
            } else if inside && y >= rows.y && y < rows.y + rows.height {
                Some(Action::Select(usize::from(y - rows.y)))
            } else {
                None
            }
        }
        Screen::Findings => {
            let (list, _) = geometry::findings(a.body);
            let inner = geometry::inset(list);
            if y >= inner.y && y < inner.y + inner.height {
                Some(Action::Select(usize::from(
                    (y - inner.y) / geometry::FINDING_LINES,
                )))
            } else {
                None
            }
        }
        Screen::Overview => None,
    }
}
