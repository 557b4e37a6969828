//! The threads `ProcCache::prefetch` reads /proc on beside its own. They are started at the
//! first prefetch and then wait for the next one: a thread started afresh queued behind its
//! busy parent for some hundreds of µs, longer than one GPU's processes take to read, so
//! started per prefetch it read a small share; a waiting one is woken in a few µs. A helper
//! with nothing to do for `IDLE` ends (a daemon reads /proc in bulk only at its first poll)
//! and is started again when needed.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{Files, Reader};

/// How long a helper waits for work before it ends.
const IDLE: Duration = Duration::from_secs(30);
/// Pids a thread takes at a time: a helper that wakes late takes fewer batches, and none
/// waits long on another's last.
const BATCH: usize = 16;

pub(super) struct Pool {
    helpers: Vec<Option<Sender<Arc<Batch>>>>,
}

/// One prefetch's pids, taken `BATCH` at a time by whichever thread asks next.
pub(super) struct Batch {
    pids: Vec<u32>,
    progress: Mutex<Progress>,
    /// Signalled when the last batch being read is in.
    settled: Condvar,
}

struct Progress {
    /// The first pid no thread has taken.
    next: usize,
    /// Batches taken and not yet in.
    reading: usize,
    read: Vec<(u32, Files)>,
}

impl Pool {
    pub(super) fn new(helpers: usize) -> Self {
        Self {
            helpers: (0..helpers).map(|_| None).collect(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.helpers.is_empty()
    }

    /// Reads the files of every pid in `pids`, on the helpers and with `reader` on this
    /// thread; what a helper that failed had taken is left out, for `get` to read.
    pub(super) fn read(
        &mut self,
        root: &Path,
        reader: &mut Reader,
        pids: Vec<u32>,
    ) -> Vec<(u32, Files)> {
        let batch = Arc::new(Batch {
            pids,
            progress: Mutex::new(Progress {
                next: 0,
                reading: 0,
                read: Vec::new(),
            }),
            settled: Condvar::new(),
        });
        for helper in &mut self.helpers {
            wake(helper, root, &batch);
        }
        batch.work(reader);
        // Only batches already taken are waited for: a helper that never woke takes none.
        let mut progress = batch.lock();
        while progress.reading > 0 {
            progress = batch
                .settled
                .wait(progress)
                .unwrap_or_else(PoisonError::into_inner);
        }
        std::mem::take(&mut progress.read)
    }
}

/// Hands `batch` to a helper, starting one if it has none or it ended.
fn wake(helper: &mut Option<Sender<Arc<Batch>>>, root: &Path, batch: &Arc<Batch>) {
    if let Some(tx) = helper {
        if tx.send(batch.clone()).is_ok() {
            return;
        }
    }
    let (tx, rx) = mpsc::channel();
    let mut reader = Reader::new(root);
    let started = std::thread::Builder::new()
        .name("gpumon-procfs".into())
        .spawn(move || serve(&rx, &mut reader));
    *helper = match started {
        // A send to a live receiver only fails once it is gone.
        Ok(_) => tx.send(batch.clone()).is_ok().then_some(tx),
        // This thread reads the helper's share instead.
        Err(_) => None,
    };
}

fn serve(jobs: &Receiver<Arc<Batch>>, reader: &mut Reader) {
    loop {
        match jobs.recv_timeout(IDLE) {
            Ok(batch) => batch.work(reader),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Batch {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes batches of pids and reads them until none is left.
    fn work(&self, reader: &mut Reader) {
        loop {
            let part = {
                let mut progress = self.lock();
                let from = progress.next;
                if from >= self.pids.len() {
                    return;
                }
                progress.next = self.pids.len().min(from + BATCH);
                progress.reading += 1;
                from..progress.next
            };
            // Counted in even if reading panics: the waiting prefetch must not wait for it.
            let done = Done(self);
            let read: Vec<_> = self.pids[part]
                .iter()
                .map(|&pid| (pid, reader.files(pid)))
                .collect();
            done.0.lock().read.extend(read);
        }
    }
}

/// Marks a taken batch as in when dropped, read or not.
struct Done<'a>(&'a Batch);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        let mut progress = self.0.lock();
        progress.reading -= 1;
        if progress.reading == 0 {
            self.0.settled.notify_all();
        }
    }
}

#[cfg(test)]
mod tests;
