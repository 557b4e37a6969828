//! Styles. Under NO_COLOR every style is a modifier (bold, reversed, dim) and never a colour,
//! and gauges tell their parts apart by glyph, so nothing depends on colour alone.

use ratatui::style::{Color, Modifier, Style};

#[derive(Debug, Clone, Copy)]
pub struct Theme {
    color: bool,
}

/// Glyphs of the memory gauge: used by processes, reserved by the driver, free.
pub const USED: &str = "█";
pub const RESERVED: &str = "▓";
pub const FREE: &str = "░";

impl Theme {
    pub fn new(color: bool) -> Self {
        Self { color }
    }

    pub fn color(self) -> bool {
        self.color
    }

    fn fg(self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    pub fn text(self) -> Style {
        Style::new()
    }

    pub fn bold(self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }

    pub fn dim(self) -> Style {
        if self.color {
            Style::new().fg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::DIM)
        }
    }

    pub fn accent(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn ok(self) -> Style {
        self.fg(Color::Green)
    }

    pub fn warn(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    pub fn crit(self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    pub fn used(self) -> Style {
        self.fg(Color::Cyan)
    }

    pub fn reserved(self) -> Style {
        self.fg(Color::Magenta)
    }

    pub fn free(self) -> Style {
        self.fg(Color::DarkGray)
    }

    pub fn peak(self) -> Style {
        self.fg(Color::Yellow)
    }

    pub fn slope(self) -> Style {
        self.fg(Color::Red)
    }

    /// The memory split's parts (ui/categories.rs), in its order: parameters, gradients,
    /// optimizer state, buffers, activations, other. Hues apart from one another; the glyphs
    /// tell them apart without colour.
    pub fn category(self, i: usize) -> Style {
        const HUES: [Color; 6] = [
            Color::Blue,
            Color::Cyan,
            Color::Magenta,
            Color::Gray,
            Color::Green,
            Color::Yellow,
        ];
        self.fg(HUES[i % HUES.len()])
    }

    pub fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    pub fn tab_active(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
    }

    pub fn border(self) -> Style {
        self.fg(Color::DarkGray)
    }

    /// Style for a finding's severity.
    pub fn severity(self, critical: bool) -> Style {
        if critical {
            self.crit()
        } else {
            self.warn()
        }
    }
}
