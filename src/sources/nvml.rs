//! The real source: NVML through nvml-wrapper, loaded at run time with `dlopen` (never linked, so
//! the binary runs on machines without the driver and says why).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::PathBuf;

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

mod fake;
pub mod unified;

use super::procinfo::ProcCache;
use super::{GpuSource, SourceError};
use crate::core::model::*;
use crate::util::pid_map::PidMap;

/// NVML's value for "MIG enabled" in `nvmlDeviceGetMigMode`.
const MIG_ENABLED: u32 = 1;

pub struct NvmlSource {
    lib_path: String,
    nvml: Option<Nvml>,
    driver_version: Option<String>,
    /// Set when the library is crates/fake-nvml (`fake.rs`).
    fake: Option<fake::Fake>,
    /// Identity by index, so a GPU that is lost keeps its name and UUID in reports.
    identities: HashMap<u32, GpuIdentity>,
    procs: ProcCache,
    /// Pid to its row among one device's processes, reused from device to device.
    rows: PidMap<usize>,
    /// The host's memory, for a unified-memory device.
    host: unified::HostMemory,
}

impl NvmlSource {
    /// `procfs` is where the host's /proc is mounted.
    pub fn new(lib_path: impl Into<String>, procfs: PathBuf) -> Self {
        Self {
            lib_path: lib_path.into(),
            nvml: None,
            driver_version: None,
            fake: None,
            identities: HashMap::new(),
            host: unified::HostMemory {
                procfs: procfs.clone(),
                cgroupfs: unified::CGROUPFS.into(),
            },
            procs: ProcCache::with_root(procfs),
            rows: PidMap::default(),
        }
    }

    fn init(&mut self) -> Result<(), SourceError> {
        let path = self.lib_path.clone();
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(&path))
            .init()
            .map_err(|e| match e {
                NvmlError::LibloadingError(err) => SourceError::LibraryMissing {
                    path: path.clone(),
                    reason: err.to_string(),
                },
                other => SourceError::InitFailed {
                    path: path.clone(),
                    reason: describe(&other),
                },
            })?;
        self.driver_version = nvml.sys_driver_version().ok();
        self.fake = fake::identify(&path);
        if let Some(f) = &self.fake {
            tracing::warn!(
                library = %path,
                identity = %f.identity,
                "the NVML library is a fake one: its GPUs and processes are a scenario's, not this machine's{}",
                if f.host_pids() {
                    ""
                } else {
                    " (orphaned memory is judged for zombies only: a pid it lists may never have run here)"
                }
            );
        }
        self.identities.clear();
        self.nvml = Some(nvml);
        Ok(())
    }
}

impl GpuSource for NvmlSource {
    fn collect(&mut self) -> Result<NodeReading, SourceError> {
        if self.nvml.is_none() {
            self.init()?;
        }
        let Some(nvml) = self.nvml.as_ref() else {
            return Err(SourceError::Query("NVML not initialised".into()));
        };
        let count = match nvml.device_count() {
            Ok(n) => n,
            Err(e) => {
                // The library itself is unusable (driver unloaded, ...): start over next time.
                self.nvml = None;
                return Err(SourceError::Query(describe(&e)));
            }
        };
        let mut reading = NodeReading {
            ts: now(),
            driver_version: self.driver_version.clone(),
            gpus: Vec::with_capacity(count as usize),
            processes: Vec::new(),
        };
        self.procs.begin();
        for index in 0..count {
            let mut gpu = GpuCollector {
                nvml,
                identities: &mut self.identities,
                procs: &mut self.procs,
                rows: &mut self.rows,
                host: &self.host,
            };
            gpu.read(index, &mut reading);
        }
        self.procs.end();
        Ok(reading)
    }

    fn proc_view(&mut self) -> Option<ProcView> {
        match &self.fake {
            Some(f) if !f.host_pids() => Some(ProcView::Simulated),
            _ => Some(self.procs.view()),
        }
    }

    fn simulated(&mut self) -> Option<String> {
        self.fake.as_ref().map(|f| f.identity.clone())
    }
}

struct GpuCollector<'a> {
    nvml: &'a Nvml,
    identities: &'a mut HashMap<u32, GpuIdentity>,
    procs: &'a mut ProcCache,
    rows: &'a mut PidMap<usize>,
    host: &'a unified::HostMemory,
}

impl GpuCollector<'_> {
    fn read(&mut self, index: u32, out: &mut NodeReading) {
        let device = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => return out.gpus.push(self.failed(index, &e)),
        };
        let identity = match self.identity(index, &device) {
            Ok(id) => id,
            Err(e) => return out.gpus.push(self.failed(index, &e)),
        };
        let memory = match device.memory_info() {
            Ok(m) => Some(memory(m)),
            Err(NvmlError::NotSupported) => None,
            Err(e) => return out.gpus.push(self.failed(index, &e)),
        };
        let mut gpu = GpuReading {
            identity,
            state: GpuState::Ok,
            error: None,
            memory,
            utilization: optional(device.utilization_rates()).map(|u| u.gpu as f64 / 100.0),
            temperature_celsius: optional(device.temperature(TemperatureSensor::Gpu))
                .map(f64::from),
            power_watts: optional(device.power_usage()).map(|mw| mw as f64 / 1000.0),
            mig_mode: optional(device.mig_mode()).is_some_and(|m| m.current == MIG_ENABLED),
            mig_devices: Vec::new(),
            unified: None,
        };
        let first = out.processes.len();
        let result = if gpu.mig_mode {
            self.read_mig(&device, &mut gpu, out).map(|()| false)
        } else {
            self.read_processes(&device, &gpu.identity, None, out)
        };
        match result {
            // No frame-buffer figure, yet the processes are listed: a unified-memory device.
            Ok(true) if gpu.memory.is_none() => {
                let mine = &out.processes[first..];
                let pids: Vec<u32> = mine.iter().map(|p| p.pid).collect();
                let used = mine.iter().try_fold(0u64, |sum, p| {
                    Some(sum.saturating_add(p.used_memory_bytes?))
                });
                let u = self.host.read(&pids, used);
                gpu.memory = u.memory();
                gpu.unified = Some(u);
            }
            Ok(_) => {}
            Err(e) => {
                gpu.state = state_of(&e);
                gpu.error = Some(format!("listing processes: {}", describe(&e)));
            }
        }
        out.gpus.push(gpu);
    }

    fn identity(&mut self, index: u32, device: &Device) -> Result<GpuIdentity, NvmlError> {
        if let Some(id) = self.identities.get(&index) {
            return Ok(id.clone());
        }
        let id = GpuIdentity {
            index,
            uuid: device.uuid()?,
            name: device.name()?,
            pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
        };
        self.identities.insert(index, id.clone());
        Ok(id)
    }

    /// A GPU that could not be read: reported with whatever identity we knew, so the operator
    /// sees which board it was.
    fn failed(&self, index: u32, e: &NvmlError) -> GpuReading {
        let identity = self.identities.get(&index).cloned().unwrap_or(GpuIdentity {
            index,
            uuid: format!("unknown-gpu-{index}"),
            name: String::new(),
            pci_bus_id: String::new(),
        });
        GpuReading {
            identity,
            state: state_of(e),
            error: Some(describe(e)),
            memory: None,
            utilization: None,
            temperature_celsius: None,
            power_watts: None,
            mig_mode: false,
            mig_devices: Vec::new(),
            unified: None,
        }
    }

    fn read_mig(
        &mut self,
        device: &Device,
        gpu: &mut GpuReading,
        out: &mut NodeReading,
    ) -> Result<(), NvmlError> {
        let slots = device.mig_device_count()?;
        for slot in 0..slots {
            let mig = match device.mig_device_by_index(slot) {
                Ok(m) => m,
                Err(NvmlError::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let uuid = mig.uuid()?;
            let reading = MigReading {
                gpu_instance_id: instance_id(self.nvml, &mig, InstanceKind::Gpu),
                compute_instance_id: instance_id(self.nvml, &mig, InstanceKind::Compute),
                memory: optional(mig.memory_info()).map(memory),
                uuid,
            };
            self.read_processes(&mig, &gpu.identity, Some(&reading), out)?;
            gpu.mig_devices.push(reading);
        }
        Ok(())
    }

    /// The device's processes, one row per pid (on this device; a process on several devices has
    /// a row on each). Ok(true) when NVML answered the compute list (it is supported here).
    fn read_processes(
        &mut self,
        device: &Device,
        gpu: &GpuIdentity,
        mig: Option<&MigReading>,
        out: &mut NodeReading,
    ) -> Result<bool, NvmlError> {
        let (compute, listed) = match device.running_compute_processes() {
            Err(NvmlError::NotSupported) => (Vec::new(), false),
            other => (other?, true),
        };
        let graphics = list_or_empty(device.running_graphics_processes())?;
        // MPS clients are listed by their own call only; the MPS server is a compute process.
        // A driver or device without MPS answers "not supported" (or nothing): no rows.
        let mps = list_or_empty(device.mps_running_compute_processes()).unwrap_or_default();
        self.rows.clear();
        self.procs.prefetch(
            compute
                .iter()
                .chain(graphics.iter())
                .chain(mps.iter())
                .map(|p| p.pid),
        );
        // One reference per device, shared by its processes' rows.
        let uuid: std::sync::Arc<str> = gpu.uuid.as_str().into();
        let mig_uuid: Option<std::sync::Arc<str>> = mig.map(|m| m.uuid.as_str().into());
        for (info, kind) in compute
            .iter()
            .map(|p| (p, ProcessKind::Compute))
            .chain(graphics.iter().map(|p| (p, ProcessKind::Graphics)))
            .chain(mps.iter().map(|p| (p, ProcessKind::Mps)))
        {
            // A process with both contexts is listed twice with the same usage: keep one row.
            // (An MPS client also listed as compute keeps its compute row.)
            // (Found by map, not by scanning the rows: that was quadratic in processes per GPU.)
            if let Some(seen) = self
                .rows
                .get(&info.pid)
                .and_then(|i| out.processes.get_mut(*i))
            {
                if seen.kind != kind && kind != ProcessKind::Mps {
                    seen.kind = ProcessKind::ComputeGraphics;
                }
                continue;
            }
            self.rows.insert(info.pid, out.processes.len());
            let nvml = self.nvml;
            let pid = info.pid;
            let proc_info = self.procs.get(pid, || {
                nvml.sys_process_name(pid, 64)
                    .ok()
                    .filter(|n| !n.is_empty())
            });
            out.processes.push(ProcessReading {
                gpu: gpu.index,
                uuid: uuid.clone(),
                pid,
                kind,
                used_memory_bytes: used_bytes(info),
                mig_uuid: mig_uuid.clone(),
                gpu_instance_id: info.gpu_instance_id.or(mig.and_then(|m| m.gpu_instance_id)),
                compute_instance_id: info
                    .compute_instance_id
                    .or(mig.and_then(|m| m.compute_instance_id)),
                info: proc_info,
            });
        }
        Ok(listed)
    }
}

fn memory(m: nvml_wrapper::struct_wrappers::device::MemoryInfo) -> MemoryInfo {
    MemoryInfo {
        total: m.total,
        used: m.used,
        free: m.free,
        reserved: m.reserved,
    }
}

fn used_bytes(p: &ProcessInfo) -> Option<u64> {
    match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    }
}

/// "Not supported" is an answer (the value is absent), not a failure.
fn optional<T>(r: Result<T, NvmlError>) -> Option<T> {
    r.ok()
}

fn list_or_empty(r: Result<Vec<ProcessInfo>, NvmlError>) -> Result<Vec<ProcessInfo>, NvmlError> {
    match r {
        Err(NvmlError::NotSupported) => Ok(Vec::new()),
        other => other,
    }
}

fn state_of(e: &NvmlError) -> GpuState {
    match e {
        NvmlError::GpuLost => GpuState::Lost,
        _ => GpuState::Error,
    }
}

fn describe(e: &NvmlError) -> String {
    match e {
        NvmlError::GpuLost => {
            "GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST); it needs a reset or a reboot"
                .into()
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".into(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        other => other.to_string(),
    }
}

enum InstanceKind {
    Gpu,
    Compute,
}

/// nvml-wrapper has no safe wrapper for the MIG instance ids, so call the symbol it loaded.
fn instance_id(nvml: &Nvml, device: &Device, kind: InstanceKind) -> Option<u32> {
    let lib = nvml.lib();
    let sym = match kind {
        InstanceKind::Gpu => lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?,
        InstanceKind::Compute => lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?,
    };
    let mut id: u32 = 0;
    // SAFETY: the handle comes from this live `Nvml`, and the out-pointer is a valid u32 for
    // the duration of the call, as nvml.h requires.
    let rc = unsafe { sym(device.handle(), &mut id) };
    (rc == 0).then_some(id)
}
