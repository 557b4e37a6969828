//! What one collection of the node looks like. `None` means "NVML has no value" (not supported,
//! not available); it is never folded into 0, because 0 bytes and "unknown" mean different things.

use serde::{Deserialize, Serialize};

/// Unix time in seconds.
pub type Timestamp = f64;

/// A GPU as every join names it: its NVML index (a MIG instance's parent's), a `u32`. Where the
/// wire carries it as a label value (findings, `trace_gpu`, `gpumon analyze`), it is a string,
/// as metrics.md has `gpu`: `#[serde(default, with = "gpu_label")]` writes and reads that.
pub mod gpu_label {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(gpu: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
        match gpu {
            Some(g) => s.collect_str(g),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        // A number is read too: what a reader wrote by hand, or a newer writer.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Index(u32),
            Label(String),
        }
        match Option::<Wire>::deserialize(d)? {
            None => Ok(None),
            Some(Wire::Index(g)) => Ok(Some(g)),
            Some(Wire::Label(l)) => l.parse().map(Some).map_err(|_| {
                D::Error::custom(format!(
                    "gpu {l:?} is not a GPU index (a whole number, as NVML numbers GPUs)"
                ))
            }),
        }
    }
}

/// Static identity of a GPU: fetched once per NVML session, it does not change while the GPU lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuIdentity {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: String,
}

/// NVML's v2 memory view: `used` excludes what the driver and firmware reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryInfo {
    pub total: u64,
    pub used: u64,
    pub free: u64,
    pub reserved: u64,
}

/// Health of one GPU in the last collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuState {
    Ok,
    /// Fell off the bus (NVML_ERROR_GPU_IS_LOST): needs a reset or reboot.
    Lost,
    /// Any other failure reading the GPU this round.
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    #[serde(flatten)]
    pub identity: GpuIdentity,
    pub state: GpuState,
    /// Why the GPU is not `Ok`, in words.
    pub error: Option<String>,
    pub memory: Option<MemoryInfo>,
    /// SM busy fraction 0..1.
    pub utilization: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    pub mig_mode: bool,
    pub mig_devices: Vec<MigReading>,
    /// A unified-memory device (GB10 and the like): NVML has no frame-buffer total for it but
    /// lists its processes. `memory` is then built from those processes' figures and the host's
    /// memory (`UnifiedMemory`), or None where a figure is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified: Option<UnifiedMemory>,
}

/// How a unified device's `memory` was built. Its `used` is the sum NVML gives per process (the
/// host's MemTotal - MemAvailable would count every host allocation as GPU memory); its `total`
/// is that plus what the allocator can still get from the host: MemAvailable, or less where a
/// cgroup's memory limit leaves less (a container's limit binds the trainer's allocations too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnifiedMemory {
    /// Sum of NVML's per-process figures; None when NVML gives some process's as "n/a".
    pub processes_used: Option<u64>,
    /// The host's MemAvailable (/proc/meminfo); None when it could not be read.
    pub host_available: Option<u64>,
    /// The least limit less usage (v2's `memory.max - memory.current`, else v1's
    /// `memory.limit_in_bytes - memory.usage_in_bytes`) over the cgroups of the device's
    /// processes and their ancestors that set a limit; None when none does.
    pub cgroup_headroom: Option<u64>,
    /// Which figure bounds the total.
    pub limit_from: Option<LimitFrom>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitFrom {
    /// The host's MemAvailable.
    HostAvailable,
    /// A cgroup's memory limit (v2's memory.max, v1's limit_in_bytes), lower than the host's
    /// MemAvailable.
    CgroupMax,
}

impl LimitFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitFrom::HostAvailable => "host_available",
            LimitFrom::CgroupMax => "cgroup_max",
        }
    }
}

impl UnifiedMemory {
    /// The device's memory from these figures: None where one it needs is missing ("n/a",
    /// never a guess).
    pub fn memory(&self) -> Option<MemoryInfo> {
        let used = self.processes_used?;
        let room = match (self.host_available, self.cgroup_headroom) {
            (Some(h), Some(c)) => h.min(c),
            (Some(h), None) => h,
            (None, _) => return None,
        };
        let total = used.saturating_add(room);
        Some(MemoryInfo {
            total,
            used,
            free: room,
            reserved: 0,
        })
    }

    /// Which figure bounds `memory()`'s total.
    pub fn bound(&self) -> Option<LimitFrom> {
        let h = self.host_available?;
        Some(match self.cgroup_headroom {
            Some(c) if c < h => LimitFrom::CgroupMax,
            _ => LimitFrom::HostAvailable,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigReading {
    pub uuid: String,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    pub memory: Option<MemoryInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    Compute,
    Graphics,
    /// Listed by both the compute and the graphics query.
    ComputeGraphics,
    /// An MPS client: listed by NVML's MPS compute query only (the MPS server itself is a
    /// compute process).
    Mps,
}

impl ProcessKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Compute => "compute",
            ProcessKind::Graphics => "graphics",
            ProcessKind::ComputeGraphics => "compute+graphics",
            ProcessKind::Mps => "mps",
        }
    }
}

/// What /proc says about a process; every field may be missing (the pid may be in another
/// namespace we cannot see, or gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub name: Option<String>,
    pub user: Option<String>,
    pub uid: Option<u32>,
    /// Container id (12 hex digits) or pod/job name from the cgroup path; None outside containers.
    pub container: Option<String>,
    pub cgroup: Option<String>,
    /// Kubernetes pod UID, from a kubepods cgroup path; None outside Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The pod's name from the kubelet, else its UID (names unknown or not configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's namespace, from the kubelet; None while names are unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The container's name in its pod, from the kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// Whether the process still runs, as /proc said when last looked at (orphan.rs). Written
    /// only when it does not: a row per process on a busy node says nothing it need not.
    #[serde(default, skip_serializing_if = "ProcState::runs")]
    pub state: Option<ProcState>,
    /// A zombie's parent (the process that has to reap it), and its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// Whether a process NVML lists is still there, from /proc/PID/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    Running,
    /// Exited, not yet reaped by its parent (state Z).
    Zombie,
    /// No such process in /proc (or its pid now names another process): exited and reaped,
    /// or, where /proc is not the host's, never visible (`ProcView`).
    Gone,
    #[serde(other)]
    Unknown,
}

impl ProcState {
    /// Running, or never looked at: nothing to say about it.
    pub fn runs(s: &Option<ProcState>) -> bool {
        matches!(s, None | Some(ProcState::Running))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcState::Running => "running",
            ProcState::Zombie => "zombie",
            ProcState::Gone => "gone",
            ProcState::Unknown => "unknown",
        }
    }
}

/// Which processes the /proc gpumon reads shows, as the source found it: only where it shows
/// the host's is a pid missing from it an exited process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcView {
    /// The initial PID namespace's /proc, or the host's mounted in a container (/host/proc).
    Host,
    /// The daemon's own PID namespace's (a container without hostPID), or one that hides
    /// other users' processes (hidepid).
    Own,
    /// The NVML library is a fake one (crates/fake-nvml) whose scenario's pids are not this
    /// host's: a pid missing from /proc never ran here.
    Simulated,
    /// Could not tell (not a proc filesystem, links unreadable).
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessReading {
    /// NVML index of the physical GPU (the parent, for MIG).
    pub gpu: u32,
    /// Shared by the rows of one device (a poll allocates no string per process).
    pub uuid: std::sync::Arc<str>,
    pub pid: u32,
    pub kind: ProcessKind,
    /// None when NVML reports NVML_VALUE_NOT_AVAILABLE.
    pub used_memory_bytes: Option<u64>,
    /// UUID of the MIG device the process runs on, when MIG is on.
    pub mig_uuid: Option<std::sync::Arc<str>>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    #[serde(flatten)]
    /// Shared with the source's cache: a poll allocates nothing per process for it.
    pub info: std::sync::Arc<ProcInfo>,
}

/// Outcome of one NVML collection over the whole node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReading {
    pub ts: Timestamp,
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuReading>,
    pub processes: Vec<ProcessReading>,
}

impl NodeReading {
    /// The NVML index of the GPU `uuid` names: the GPU itself, or for a MIG instance its
    /// parent (the one join every output uses).
    pub fn gpu_index_of(&self, uuid: &str) -> Option<u32> {
        self.gpus
            .iter()
            .find(|g| g.identity.uuid == uuid || g.mig_devices.iter().any(|m| m.uuid == uuid))
            .map(|g| g.identity.index)
    }
}

pub fn now() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
