//! The simulated node's NVML scenario (for the fake NVML library): two H100s whose process lists
//! are the demo's trainer processes, with the memory they report, on the same clock. The job's
//! ranks leave the list when they die.

use std::fmt::Write;

use super::job;
use super::profile::{Profile, DRIVER_RESERVED, TOTAL};

pub const UUIDS: [&str; 2] = [
    "GPU-de300000-0000-4000-8000-000000000000",
    "GPU-de300000-0000-4000-8000-000000000001",
];

/// A timeline of `p`'s NVML memory: sampled each `step` seconds, periodic for the leak; the
/// untracked trainer's by its bends.
fn timeline(p: Profile) -> String {
    if let Some([start, stop]) = p.outside_bends() {
        // Flat, a straight rise, then flat again (the last point holds).
        let pts: Vec<String> = [0.0, start, stop]
            .iter()
            .map(|t| format!("[{t:.3}, {}]", p.nvml_used(*t)))
            .collect();
        return format!("{{ points = [{}] }}", pts.join(", "));
    }
    let (span, every) = match p.period() {
        Some(period) => (period, period / 64.0),
        None => (60.0, 60.0),
    };
    let mut pts = Vec::new();
    let mut t = 0.0;
    while t <= span + 1e-9 {
        pts.push(format!("[{t:.3}, {}]", p.nvml_used(t.min(span - 1e-6))));
        t += every;
    }
    match p.period() {
        Some(period) => format!("{{ points = [{}], repeat = {period:.3} }}", pts.join(", ")),
        None => format!("{}", p.nvml_used(30.0)),
    }
}

/// The node with the single trainers' `children` and the job's `ranks`, each with its pid.
pub fn toml(children: &[(Profile, u32)], ranks: &[(u64, u32)]) -> String {
    let mut s = String::from(
        "# Written by `gpumon demo`: a simulated node. Its processes are the demo's own, this host's.\nhost_pids = true\ndriver_version = \"550.54.15\"\nnvml_version = \"12.550.54.15\"\ncuda_driver_version = 12040\n",
    );
    let busy = [
        "{ points = [[0, 93], [7, 97], [13, 91]], repeat = 20.0 }",
        "{ points = [[0, 99], [5, 96]], repeat = 10.0 }",
    ];
    for (gpu, uuid) in UUIDS.iter().enumerate() {
        let _ = write!(
            s,
            "\n[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nuuid = \"{uuid}\"\npci_bus_id = \"00000000:{:02X}:00.0\"\nmemory_total = {TOTAL}\nmemory_reserved = {DRIVER_RESERVED}\nutilization_gpu = {}\nutilization_memory = 41\ntemperature = {}\npower_usage_mw = {}\npower_limit_mw = 700000\n",
            0x17 + gpu * 0x13,
            busy[gpu],
            [58, 66][gpu],
            [512000, 641000][gpu],
        );
        for (p, pid) in children.iter().filter(|(p, _)| p.gpu() == gpu) {
            let _ = write!(
                s,
                "\n[[gpu.process]]\npid = {pid}\nname = \"gpumon\"\nused = {}\n",
                timeline(*p)
            );
        }
        for (rank, pid) in ranks.iter().filter(|_| gpu == job::GPU) {
            let _ = write!(
                s,
                "\n[[gpu.process]]\npid = {pid}\nname = \"gpumon\"\nused = {}\nend = {:.3}\n",
                job::nvml_used(*rank),
                job::end(*rank)
            );
        }
    }
    s
}
