//! Runs the GPU source on its own OS thread, on its own schedule: NVML calls block (a hung
//! driver can stall for seconds), so they never run on the async runtime's workers.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::aggregator::Handle;
use crate::core::model::{now, GpuState, NodeReading};
use crate::core::store::{Collection, NvmlStatus};
use crate::sources::GpuSource;
use crate::util::backoff::Backoff;

/// Encodes the NVML families of one collection (given by the daemon: the exposition format is
/// an output's business). Run here, after the poll, so no scrape and no trainer waits on it.
pub type Encode = fn(&NvmlStatus, Option<&NodeReading>) -> String;

/// Longest wait between attempts to load a missing or failing NVML.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Polls until `stop` receives a message or its sender is dropped, or the aggregator is gone.
pub fn run(
    mut source: Box<dyn GpuSource>,
    aggregator: Handle,
    encode: Encode,
    interval: Duration,
    stop: Receiver<()>,
) {
    let mut status = NvmlStatus::default();
    let mut backoff = Backoff::new(interval, MAX_BACKOFF);
    let mut last_error: Option<String> = None;
    let mut gpu_states: HashMap<String, GpuState> = HashMap::new();
    loop {
        let started = Instant::now();
        let result = source.collect();
        let duration = started.elapsed().as_secs_f64();
        let wait = match result {
            Ok(reading) => {
                if last_error.take().is_some() {
                    tracing::info!(gpus = reading.gpus.len(), "NVML is up again");
                }
                log_gpu_changes(&reading, &mut gpu_states);
                backoff.reset();
                status.proc_view = source.proc_view();
                status.simulated = source.simulated();
                status.record_ok(reading.ts, duration);
                let text = encode(&status, Some(&reading));
                let sent = aggregator.offer_collection(Collection {
                    ts: reading.ts,
                    reading: Ok(Arc::new(reading)),
                    status: status.clone(),
                    text: Arc::from(text),
                });
                if !sent {
                    return;
                }
                interval.saturating_sub(started.elapsed())
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    tracing::error!(error = %msg, retry_in = ?backoff.current(), "NVML unavailable; serving gpumon_nvml_up 0 and retrying");
                } else {
                    tracing::debug!(error = %msg, retry_in = ?backoff.current(), "NVML still unavailable");
                }
                let ts = now();
                status.record_failure(ts, msg.clone(), duration);
                let text = encode(&status, None);
                let sent = aggregator.offer_collection(Collection {
                    ts,
                    reading: Err(msg.clone()),
                    status: status.clone(),
                    text: Arc::from(text),
                });
                if !sent {
                    return;
                }
                last_error = Some(msg);
                backoff.fail()
            }
        };
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Logs a GPU going bad or coming back once, not at every poll.
fn log_gpu_changes(reading: &NodeReading, states: &mut HashMap<String, GpuState>) {
    for g in &reading.gpus {
        let id = &g.identity;
        let before = states.insert(id.uuid.clone(), g.state);
        if before == Some(g.state) {
            continue;
        }
        match g.state {
            GpuState::Ok if before.is_some() => {
                tracing::info!(gpu = id.index, uuid = %id.uuid, "GPU answers again")
            }
            GpuState::Ok => {}
            GpuState::Lost | GpuState::Error => tracing::error!(
                gpu = id.index,
                uuid = %id.uuid,
                state = ?g.state,
                error = g.error.as_deref().unwrap_or(""),
                "GPU cannot be read; the other GPUs are still monitored"
            ),
        }
    }
    states.retain(|uuid, _| reading.gpus.iter().any(|g| &g.identity.uuid == uuid));
}
