//! A session on a unified-memory GPU (model.rs `UnifiedMemory`): its samples take that device's
//! figures as the allocator's room. torch's `mem_get_info` there reports the host's memory,
//! without a container's limit; with the daemon's figures every reader of the sample (near-limit,
//! the forecast, the ledger, the split's largest safe batch) judges against the limit the outputs
//! show. A recorded session's trace notes the figures (`trace_unified`) and `gpumon analyze`
//! puts them back, so a replay judges against the same limit.

use std::collections::HashMap;

use crate::core::model::NodeReading;
use crate::core::store::sessions::Session;
use crate::core::trainer::Sample;

/// The unified device's free and total bytes, as a sample's `device_free` and `device_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub free: u64,
    pub total: u64,
}

/// The room of `session`'s GPU in the latest collection, when that GPU is unified and its
/// figures are known.
pub fn room_of(latest: Option<&NodeReading>, session: Option<&Session>) -> Option<Room> {
    let uuid = session?.hello.gpu_uuid.as_deref()?;
    let m = latest?
        .gpus
        .iter()
        .find(|g| g.unified.is_some() && g.identity.uuid == uuid)?
        .memory?;
    Some(Room {
        free: m.free,
        total: m.total,
    })
}

/// `s` with the unified device's figures in place of the trainer's, when there are any.
pub fn bound(mut s: Sample, room: Option<Room>) -> Sample {
    if let Some(r) = room {
        s.device_free = Some(r.free);
        s.device_total = Some(r.total);
    }
    s
}

/// The figures a replay was given, by session key (`trace_unified`).
#[derive(Debug, Default)]
pub struct Replayed(HashMap<u64, Room>);

impl Replayed {
    pub fn note(&mut self, key: u64, room: Option<Room>) {
        match room {
            Some(r) => self.0.insert(key, r),
            None => self.0.remove(&key),
        };
    }

    pub fn get(&self, key: u64) -> Option<Room> {
        self.0.get(&key).copied()
    }
}

/// The `trace_unified` line to write before a sample, when the room changed since `last` (what
/// the trace holds); updates `last`. No newline, as `trace::nvml_line`.
pub fn line(room: Option<Room>, last: &mut Option<Room>) -> Option<Vec<u8>> {
    if room == *last {
        return None;
    }
    *last = room;
    Some(
        match room {
            Some(r) => format!(
                "{{\"type\":\"trace_unified\",\"free_bytes\":{},\"total_bytes\":{}}}",
                r.free, r.total
            ),
            None => "{\"type\":\"trace_unified\"}".to_string(),
        }
        .into_bytes(),
    )
}
