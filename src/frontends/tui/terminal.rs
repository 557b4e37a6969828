//! Never leave the terminal broken: raw mode, the alternate screen and mouse capture are undone
//! when the guard drops, when anything panics, and on SIGTERM/SIGINT/SIGHUP/SIGQUIT (which are
//! taken by a thread with `sigwait` and turned into a clean exit of the event loop; a second
//! signal restores and exits at once, in case the loop is stuck).

use std::io::{stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Once;

use crossterm::cursor::{Hide, Show};
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};

use crate::frontends::tui::Msg;

static ACTIVE: AtomicBool = AtomicBool::new(false);

pub struct Guard(());

impl Guard {
    pub fn enter() -> std::io::Result<Self> {
        install_panic_hook();
        enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        if let Err(e) = execute!(stdout(), EnterAlternateScreen, EnableMouseCapture, Hide) {
            restore();
            return Err(e);
        }
        Ok(Self(()))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts the terminal back as it was; safe to call more than once, from any thread.
pub fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let mut out = stdout();
        let _ = execute!(out, DisableMouseCapture, LeaveAlternateScreen, Show);
        let _ = disable_raw_mode();
        let _ = out.flush();
    }
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

const SIGNALS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Blocks the exit signals in this thread and every thread it starts afterwards, so only the
/// `sigwait` thread sees them. Call before starting any thread.
pub fn block_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use; pthread_sigmask
    // only reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

pub fn spawn_signal_thread(set: libc::sigset_t, tx: Sender<Msg>) {
    let _ = std::thread::Builder::new()
        .name("gpumon-tui-signals".into())
        .spawn(move || {
            let mut seen = 0;
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` holds the blocked signals and `sig` is a valid out-pointer.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    return;
                }
                seen += 1;
                if seen > 1 || tx.send(Msg::Signal(sig)).is_err() {
                    restore();
                    std::process::exit(128 + sig);
                }
            }
        });
}

#[cfg(test)]
mod tests;
