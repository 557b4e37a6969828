//! The loop: wait for a message (input, data, signal), turn it into actions, update, and draw
//! only when something changed. It sleeps in `recv` between messages, so an idle TUI costs
//! one fetch and at most one frame per refresh. Generic over the backend, so tests drive it
//! with `TestBackend`.

use std::sync::mpsc::Receiver;

use ratatui::backend::Backend;
use ratatui::Terminal;

use crate::frontends::tui::app::input;
use crate::frontends::tui::app::state::{Action, App};
use crate::frontends::tui::{ui, Msg};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Quit,
    /// The signal that ended it; the process then exits with 128 + signal.
    Signal(i32),
    /// Every sender is gone (only in tests: the real sources never stop).
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub exit: Exit,
    pub frames: u64,
}

pub fn run<B>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    rx: &Receiver<Msg>,
) -> anyhow::Result<Outcome>
where
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut frames = 0;
    let mut dirty = true;
    let mut fetched = false;
    loop {
        if dirty {
            terminal.draw(|f| ui::render(f, app))?;
            frames += 1;
            dirty = false;
        }
        if fetched {
            // The answer and its parse are freed now: give their pages back when that is
            // much (after a whole answer or a burst, 1-8 MiB at 64 trainers stayed resident).
            crate::malloc::trim_if_worth_it();
            fetched = false;
        }
        let Ok(first) = rx.recv() else {
            return Ok(Outcome {
                exit: Exit::Closed,
                frames,
            });
        };
        // Take everything already queued before drawing: a burst (wheel scroll, several nodes
        // answering at once) costs one frame.
        for msg in std::iter::once(first).chain(rx.try_iter()) {
            let action = match msg {
                Msg::Signal(sig) => {
                    return Ok(Outcome {
                        exit: Exit::Signal(sig),
                        frames,
                    })
                }
                Msg::InputClosed(e) => anyhow::bail!("cannot read the terminal: {e}"),
                Msg::Input(ev) => input::action(app, &ev),
                Msg::Data(node, update) => {
                    fetched = true;
                    Some(Action::Data { node, update })
                }
            };
            if let Some(a) = action {
                dirty |= app.update(a);
            }
            if app.quit {
                return Ok(Outcome {
                    exit: Exit::Quit,
                    frames,
                });
            }
        }
    }
}
