//! `gpumon tui`: a terminal dashboard over the daemon's JSON API (or NVML in-process when no
//! daemon answers). State changes only in `App::update(Action)`; `ui::render` draws from
//! `&App`; `event_loop::run` is generic over the ratatui backend.

pub mod app;
pub mod event_loop;
pub mod finding;
#[doc(hidden)]
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod geometry;
pub mod source;
pub mod terminal;
pub mod ui;

use std::io::IsTerminal;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use crate::frontends::local::Machine;
use app::state::{Action, App, Node, Origin, Update};
use event_loop::Exit;

/// What the event loop waits on.
#[derive(Debug)]
pub enum Msg {
    Input(crossterm::event::Event),
    InputClosed(String),
    Data(usize, Update),
    Signal(i32),
}

pub struct Options {
    /// Daemons to show; empty means the local one (`Machine::listen`), else NVML in-process.
    pub connect: Vec<String>,
    pub refresh: Duration,
    /// TLS and basic auth for the daemons in `connect`.
    pub client: crate::daemon_client::DaemonClient,
}

pub fn run(machine: &Machine, opts: Options) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "gpumon tui needs a terminal on stdout; for a one-shot report use `gpumon status` (or `gpumon status --json`)"
        );
    }
    let urls = opts
        .connect
        .iter()
        .map(|u| source::normalize_url(u))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let refresh = opts.refresh.max(Duration::from_millis(100));
    crate::malloc::one_arena();
    // Before any thread starts, so they all inherit the mask and only sigwait sees the signals.
    let signals = terminal::block_signals().context("blocking signals")?;
    let (tx, rx) = mpsc::channel();
    let mut nodes = Vec::new();
    if urls.is_empty() {
        let url = format!("http://{}", machine.listen);
        match source::probe(&url, &opts.client) {
            Ok(snap) => {
                nodes.push(Node::new(Origin::Daemon { url: url.clone() }));
                let cursor = source::next_cursor(&snap);
                let _ = tx.send(Msg::Data(0, Update::Snapshot(Box::new(snap))));
                source::spawn_daemon(0, url, refresh, opts.client.clone(), tx.clone(), cursor);
            }
            Err(_) => {
                let reason = format!("no daemon at {}", machine.listen);
                nodes.push(Node::new(Origin::InProcess { reason }));
                source::spawn_in_process(
                    0,
                    machine.nvml_lib.clone(),
                    machine.procfs.clone(),
                    refresh,
                    tx.clone(),
                );
            }
        }
    } else {
        for (i, url) in urls.into_iter().enumerate() {
            nodes.push(Node::new(Origin::Daemon { url: url.clone() }));
            source::spawn_daemon(i, url, refresh, opts.client.clone(), tx.clone(), None);
        }
    }
    terminal::spawn_signal_thread(signals, tx.clone());

    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut app = App::new(nodes, color);
    let guard = terminal::Guard::enter().context("setting up the terminal")?;
    spawn_input(tx);
    let mut term = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    let size = term.size()?;
    app.update(Action::Resize {
        width: size.width,
        height: size.height,
    });
    let outcome = event_loop::run(&mut term, &mut app, &rx);
    drop(term);
    drop(guard);
    match outcome?.exit {
        Exit::Signal(sig) => std::process::exit(128 + sig),
        Exit::Quit | Exit::Closed => Ok(()),
    }
}

/// Terminal events on their own thread: `event::read` blocks, the loop must not.
fn spawn_input(tx: mpsc::Sender<Msg>) {
    let _ = std::thread::Builder::new()
        .name("gpumon-tui-input".into())
        .spawn(move || loop {
            let msg = match crossterm::event::read() {
                Ok(ev) => Msg::Input(ev),
                Err(e) => {
                    let _ = tx.send(Msg::InputClosed(e.to_string()));
                    return;
                }
            };
            if tx.send(msg).is_err() {
                return;
            }
        });
}

#[cfg(test)]
mod tests;
