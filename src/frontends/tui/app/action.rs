//! The screens, and the actions that change the state (`App::update`): input mapped by
//! input.rs, and data from the sources.

use super::node::Update;
use super::rows::Column;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Overview,
    Processes,
    Findings,
}

impl Screen {
    pub const ALL: [Screen; 3] = [Screen::Overview, Screen::Processes, Screen::Findings];

    pub fn title(self) -> &'static str {
        match self {
            Screen::Overview => "Overview",
            Screen::Processes => "Processes",
            Screen::Findings => "Findings",
        }
    }

    pub(super) fn step(self, by: isize) -> Screen {
        let i = Screen::ALL.iter().position(|s| *s == self).unwrap_or(0) as isize;
        let n = Screen::ALL.len() as isize;
        Screen::ALL[(i + by).rem_euclid(n) as usize]
    }
}

#[derive(Debug, Clone)]
pub enum Action {
    Data {
        node: usize,
        update: Update,
    },
    Resize {
        width: u16,
        height: u16,
    },
    Quit,
    NextScreen,
    PrevScreen,
    Show(Screen),
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    /// Selects the n-th visible row of the current list (mouse).
    Select(usize),
    Open,
    Back,
    ToggleHelp,
    /// The help's next page (closing it after the last).
    HelpPage,
    /// Trainer chart: floor only, or floor, peak and reserved.
    ToggleZoom,
    SortNext,
    SortReverse,
    SortBy(Column),
    FilterStart,
    FilterInput(char),
    FilterBackspace,
    FilterApply,
    FilterCancel,
}
