//! The scenario file: what the fake GPUs report. Parsed with serde + toml; unknown keys are
//! rejected so a typo fails loudly instead of silently using a default.

use crate::ret::ErrorName;
use crate::value::Value;
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    #[serde(default = "default_nvml_version")]
    pub nvml_version: String,
    #[serde(default = "default_cuda_version")]
    pub cuda_driver_version: i32,
    /// When set, every `nvmlInit*` fails with this error.
    pub init_error: Option<ErrorName>,
    /// Whether the processes listed are meant as this host's (a test's own processes, a pid
    /// no kernel gives), so a reader may judge a pid missing from /proc as exited. By default
    /// they are the scenario's own, and most exist on no host (`fakeNvmlIdentity` says which).
    #[serde(default)]
    pub host_pids: bool,
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    #[serde(default = "default_gpu_name")]
    pub name: String,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    #[serde(default = "default_pci_device_id")]
    pub pci_device_id: u32,
    #[serde(default = "default_pci_sub_system_id")]
    pub pci_sub_system_id: u32,
    pub memory_total: u64,
    #[serde(default)]
    pub memory_reserved: u64,
    pub memory_used_extra: Option<Value>,
    pub utilization_gpu: Option<Value>,
    pub utilization_memory: Option<Value>,
    pub encoder_utilization: Option<Value>,
    pub decoder_utilization: Option<Value>,
    pub temperature: Option<Value>,
    pub power_usage_mw: Option<Value>,
    pub power_limit_mw: Option<u32>,
    pub fan_speed: Option<Value>,
    pub clock_mhz: Option<Clocks>,
    pub max_clock_mhz: Option<Clocks>,
    #[serde(default)]
    pub mig_mode: bool,
    /// Default: true when `mig_mode` is on or any `[[gpu.mig]]` is listed.
    pub mig_capable: Option<bool>,
    /// `nvmlDeviceGetMaxMigDeviceCount` for a MIG-capable GPU. Default 7.
    pub max_mig_devices: Option<u32>,
    #[serde(default, rename = "process")]
    pub processes: Vec<Process>,
    #[serde(default, rename = "process_group")]
    pub process_groups: Vec<ProcessGroup>,
    pub churn: Option<Churn>,
    #[serde(default, rename = "mig")]
    pub migs: Vec<Mig>,
    #[serde(default, rename = "fault")]
    pub faults: Vec<Fault>,
}

/// Clock domains, in MHz (`nvmlClockType_t`: graphics 0, sm 1, memory 2, video 3).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clocks {
    pub graphics: Option<Value>,
    pub sm: Option<Value>,
    pub memory: Option<Value>,
    pub video: Option<Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    #[default]
    Compute,
    Graphics,
    /// Listed by both the compute and the graphics calls (a "C+G" process).
    Both,
    /// Listed only by `nvmlDeviceGetMPSComputeRunningProcesses_v3`.
    Mps,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    #[serde(default)]
    pub kind: Kind,
    #[serde(default = "zero")]
    pub used: Value,
    pub name: Option<String>,
    #[serde(default)]
    pub start: f64,
    pub end: Option<f64>,
    pub mig: Option<usize>,
}

/// `count` processes with pids `pid_base + k * pid_step`; member k uses `used + k * used_step`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessGroup {
    pub count: u32,
    pub pid_base: u32,
    #[serde(default = "one")]
    pub pid_step: u32,
    #[serde(default)]
    pub kind: Kind,
    #[serde(default = "zero")]
    pub used: Value,
    #[serde(default)]
    pub used_step: f64,
    pub name: Option<String>,
    #[serde(default)]
    pub start: f64,
    pub end: Option<f64>,
    pub mig: Option<usize>,
}

/// Short-lived processes: number k (k = 0, 1, ...) has pid `pid_base + k` and lives from
/// `start + k / rate_per_s` for `lifetime_s` seconds, until `end`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Churn {
    pub rate_per_s: f64,
    pub lifetime_s: f64,
    pub pid_base: u32,
    #[serde(default = "zero")]
    pub used: Value,
    #[serde(default)]
    pub kind: Kind,
    pub name: Option<String>,
    #[serde(default)]
    pub start: f64,
    pub end: Option<f64>,
    pub mig: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    /// Slot for `nvmlDeviceGetMigDeviceHandleByIndex`. Default: position in the list.
    pub index: Option<u32>,
    pub uuid: Option<String>,
    pub name: Option<String>,
    /// e.g. "1g.10gb"; used in the default name.
    pub profile: Option<String>,
    pub memory_total: u64,
    #[serde(default)]
    pub memory_reserved: u64,
    pub memory_used_extra: Option<Value>,
    pub gpu_instance_id: u32,
    #[serde(default)]
    pub compute_instance_id: u32,
}

/// Which calls an injected fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// nvmlDeviceGetHandleBy* for this GPU.
    Handle,
    Name,
    Uuid,
    Pci,
    Index,
    Memory,
    Processes,
    Utilization,
    Temperature,
    Power,
    Fan,
    Clocks,
    Mig,
    /// Every per-device call, handle lookup included (a GPU that fell off the bus).
    Any,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub call: Call,
    pub error: ErrorName,
    #[serde(default)]
    pub from: f64,
    pub until: Option<f64>,
}

fn default_driver_version() -> String {
    "550.54.15".into()
}
fn default_nvml_version() -> String {
    "12.550.54.15".into()
}
fn default_cuda_version() -> i32 {
    12040
}
fn default_gpu_name() -> String {
    "NVIDIA H100 80GB HBM3".into()
}
fn default_pci_device_id() -> u32 {
    0x2330_10DE
}
fn default_pci_sub_system_id() -> u32 {
    0x16C1_10DE
}
fn zero() -> Value {
    Value::Const(0.0)
}
fn one() -> u32 {
    1
}

/// Longest string NVML callers are guaranteed to accept (the *_V2_BUFFER_SIZE constants are 96,
/// including the NUL).
const MAX_STRING: usize = 95;

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read scenario {}: {e}", path.display()))?;
        Scenario::parse(&text).map_err(|e| format!("scenario {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
        s.validate()?;
        Ok(s)
    }

    /// Checks what serde cannot: cross references, ranges, and where "n/a" is allowed.
    fn validate(&self) -> Result<(), String> {
        check_string("driver_version", &self.driver_version)?;
        check_string("nvml_version", &self.nvml_version)?;
        for (g, gpu) in self.gpus.iter().enumerate() {
            gpu.validate(&format!("gpu[{g}]"))?;
        }
        Ok(())
    }
}

fn check_string(what: &str, s: &str) -> Result<(), String> {
    if s.len() > MAX_STRING || s.contains('\0') {
        return Err(format!(
            "{what} = {s:?}: must be at most {MAX_STRING} bytes with no NUL"
        ));
    }
    Ok(())
}

fn check_number(what: &str, v: &Option<Value>) -> Result<(), String> {
    match v {
        Some(Value::NotAvailable) => Err(format!(
            "{what} = \"n/a\": \"n/a\" is only allowed for process memory (`used`); omit the key for NOT_SUPPORTED"
        )),
        _ => Ok(()),
    }
}

fn check_span(what: &str, start: f64, end: Option<f64>) -> Result<(), String> {
    if !start.is_finite() {
        return Err(format!("{what}.start = {start} must be finite"));
    }
    match end {
        Some(e) if e.is_nan() || e <= start => {
            Err(format!("{what}.end = {e} must be after start = {start}"))
        }
        _ => Ok(()),
    }
}

impl Gpu {
    pub fn mig_capable(&self) -> bool {
        self.mig_capable
            .unwrap_or(self.mig_mode || !self.migs.is_empty())
    }

    pub fn max_mig_devices(&self) -> u32 {
        if self.mig_capable() {
            self.max_mig_devices.unwrap_or(7)
        } else {
            0
        }
    }

    /// Position in `migs` of the MIG device at `slot`.
    pub fn mig_at_slot(&self, slot: u32) -> Option<usize> {
        self.migs
            .iter()
            .enumerate()
            .position(|(i, m)| m.index.unwrap_or(i as u32) == slot)
    }

    fn check_mig_ref(&self, what: &str, mig: Option<usize>) -> Result<(), String> {
        match mig {
            Some(m) if m >= self.migs.len() => Err(format!(
                "{what}.mig = {m}: this gpu has {} [[gpu.mig]] entries (mig is a 0-based index into them)",
                self.migs.len()
            )),
            None if self.mig_mode && !self.migs.is_empty() => Err(format!(
                "{what}: mig_mode is on, so set `mig` to the index of the [[gpu.mig]] it runs in"
            )),
            _ => Ok(()),
        }
    }

    fn validate(&self, at: &str) -> Result<(), String> {
        check_string(&format!("{at}.name"), &self.name)?;
        if let Some(u) = &self.uuid {
            check_string(&format!("{at}.uuid"), u)?;
        }
        if let Some(p) = &self.pci_bus_id {
            parse_bus_id(p).ok_or_else(|| {
                format!("{at}.pci_bus_id = {p:?}: expected DDDDDDDD:BB:DD.F (hex), e.g. \"00000000:17:00.0\"")
            })?;
        }
        if self.memory_reserved > self.memory_total {
            return Err(format!(
                "{at}.memory_reserved = {} is larger than memory_total = {}",
                self.memory_reserved, self.memory_total
            ));
        }
        for (key, v) in [
            ("memory_used_extra", &self.memory_used_extra),
            ("utilization_gpu", &self.utilization_gpu),
            ("utilization_memory", &self.utilization_memory),
            ("encoder_utilization", &self.encoder_utilization),
            ("decoder_utilization", &self.decoder_utilization),
            ("temperature", &self.temperature),
            ("power_usage_mw", &self.power_usage_mw),
            ("fan_speed", &self.fan_speed),
        ] {
            check_number(&format!("{at}.{key}"), v)?;
        }
        for (table, clocks) in [
            ("clock_mhz", &self.clock_mhz),
            ("max_clock_mhz", &self.max_clock_mhz),
        ] {
            if let Some(c) = clocks {
                for (key, v) in [
                    ("graphics", &c.graphics),
                    ("sm", &c.sm),
                    ("memory", &c.memory),
                    ("video", &c.video),
                ] {
                    check_number(&format!("{at}.{table}.{key}"), v)?;
                }
            }
        }
        let max = self.max_mig_devices();
        let mut slots = Vec::new();
        for (i, m) in self.migs.iter().enumerate() {
            let mat = format!("{at}.mig[{i}]");
            let slot = m.index.unwrap_or(i as u32);
            if slot >= max {
                return Err(format!(
                    "{mat}.index = {slot}: must be below max_mig_devices = {max}"
                ));
            }
            if slots.contains(&slot) {
                return Err(format!(
                    "{mat}.index = {slot}: another [[gpu.mig]] already uses this slot"
                ));
            }
            slots.push(slot);
            if m.memory_reserved > m.memory_total {
                return Err(format!(
                    "{mat}.memory_reserved is larger than its memory_total"
                ));
            }
            check_number(&format!("{mat}.memory_used_extra"), &m.memory_used_extra)?;
            for (key, s) in [("uuid", &m.uuid), ("name", &m.name)] {
                if let Some(s) = s {
                    check_string(&format!("{mat}.{key}"), s)?;
                }
            }
        }
        for (i, p) in self.processes.iter().enumerate() {
            let check = |pat: &str| -> Result<(), String> {
                check_span(pat, p.start, p.end)?;
                self.check_mig_ref(pat, p.mig)?;
                if let Some(n) = &p.name {
                    check_string(&format!("{pat}.name"), n)?;
                }
                Ok(())
            };
            // The entry is named only in an error: a node lists thousands that pass.
            if check("").is_err() {
                check(&format!("{at}.process[{i}]"))?;
            }
        }
        for (i, p) in self.process_groups.iter().enumerate() {
            let pat = format!("{at}.process_group[{i}]");
            check_span(&pat, p.start, p.end)?;
            self.check_mig_ref(&pat, p.mig)?;
            if p.pid_step == 0 {
                return Err(format!("{pat}.pid_step = 0: pids in a group must differ"));
            }
            let last = u64::from(p.pid_base)
                + u64::from(p.count.saturating_sub(1)) * u64::from(p.pid_step);
            if last > u64::from(u32::MAX) {
                return Err(format!(
                    "{pat}: the last pid {last} does not fit in 32 bits"
                ));
            }
            if !p.used_step.is_finite() {
                return Err(format!("{pat}.used_step must be finite"));
            }
        }
        if let Some(c) = &self.churn {
            let cat = format!("{at}.churn");
            if !(c.rate_per_s.is_finite() && c.rate_per_s > 0.0) {
                return Err(format!(
                    "{cat}.rate_per_s = {}: must be a positive number",
                    c.rate_per_s
                ));
            }
            if !(c.lifetime_s.is_finite() && c.lifetime_s > 0.0) {
                return Err(format!(
                    "{cat}.lifetime_s = {}: must be a positive number",
                    c.lifetime_s
                ));
            }
            check_span(&cat, c.start, c.end)?;
            self.check_mig_ref(&cat, c.mig)?;
        }
        for (i, f) in self.faults.iter().enumerate() {
            if !f.from.is_finite() {
                return Err(format!("{at}.fault[{i}].from must be finite"));
            }
            if let Some(u) = f.until {
                if u.is_nan() || u <= f.from {
                    return Err(format!(
                        "{at}.fault[{i}].until = {u} must be after from = {}",
                        f.from
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Parses "DDDDDDDD:BB:DD.F" (or the legacy "DDDD:BB:DD.F") into (domain, bus, device, function).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |p: &str, max_len: usize| {
        if p.is_empty() || p.len() > max_len {
            None
        } else {
            u32::from_str_radix(p, 16).ok()
        }
    };
    Some((hex(domain, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[[gpu]]\nmemory_total = 1000\n";

    #[test]
    fn minimal_scenario_gets_defaults() {
        let s = Scenario::parse(MIN).unwrap();
        assert_eq!(s.gpus.len(), 1);
        assert_eq!(s.driver_version, "550.54.15");
        assert_eq!(s.gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert!(!s.gpus[0].mig_capable());
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Scenario::parse("[[gpu]]\nmemory_total = 1\nmemroy_reserved = 5\n").unwrap_err();
        assert!(e.contains("memroy_reserved"), "{e}");
    }

    #[test]
    fn bad_enum_value_is_named() {
        let e = Scenario::parse(&format!(
            "{MIN}[[gpu.fault]]\ncall = \"memory\"\nerror = \"gpu_fell_off\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("gpu_fell_off"), "{e}");
        let e = Scenario::parse(&format!("{MIN}[[gpu.process]]\npid = 1\nkind = \"cuda\"\n"))
            .unwrap_err();
        assert!(e.contains("cuda"), "{e}");
    }

    #[test]
    fn missing_required_key_is_named() {
        let e = Scenario::parse("[[gpu]]\nname = \"x\"\n").unwrap_err();
        assert!(e.contains("memory_total"), "{e}");
    }

    #[test]
    fn na_only_for_process_memory() {
        let e = Scenario::parse(&format!("{MIN}temperature = \"n/a\"\n")).unwrap_err();
        assert!(e.contains("gpu[0].temperature"), "{e}");
        Scenario::parse(&format!("{MIN}[[gpu.process]]\npid = 1\nused = \"n/a\"\n")).unwrap();
    }

    #[test]
    fn mig_references_are_checked() {
        let e = Scenario::parse(&format!("{MIN}[[gpu.process]]\npid = 1\nmig = 2\n")).unwrap_err();
        assert!(e.contains("gpu[0].process[0].mig = 2"), "{e}");
        let text = "[[gpu]]\nmemory_total = 10\nmig_mode = true\n[[gpu.mig]]\nmemory_total = 5\ngpu_instance_id = 1\n[[gpu.process]]\npid = 1\n";
        let e = Scenario::parse(text).unwrap_err();
        assert!(e.contains("mig_mode is on"), "{e}");
    }

    #[test]
    fn reserved_larger_than_total_rejected() {
        let e = Scenario::parse("[[gpu]]\nmemory_total = 10\nmemory_reserved = 11\n").unwrap_err();
        assert!(e.contains("memory_reserved"), "{e}");
    }

    #[test]
    fn bus_ids() {
        assert_eq!(parse_bus_id("00000000:17:00.0"), Some((0, 0x17, 0, 0)));
        assert_eq!(parse_bus_id("0001:AB:1f.3"), Some((1, 0xAB, 0x1F, 3)));
        assert_eq!(parse_bus_id("17:00.0"), None);
        let e = Scenario::parse(&format!("{MIN}pci_bus_id = \"nope\"\n")).unwrap_err();
        assert!(e.contains("pci_bus_id"), "{e}");
    }
}
