use std::fmt::Write as _;

use super::*;
use crate::frontends::tui::fixtures;

mod categories;
mod jobs;
use crate::units::{bytes, opt};

/// The table as `layout` wrote it with `format!` and a String per cell: what the hand-written
/// rows must match byte for byte.
fn old_table(snap: &Snapshot, origin: &Origin) -> String {
    let escaped = crate::util::printable::printable_copy(snap);
    let snap = escaped.as_ref().unwrap_or(snap);
    let mut out = old_layout(snap, origin);
    // New with the legend, not part of what `format!` wrote.
    super::legend::section(snap, &mut out);
    crate::util::printable::printable_lines(&out).into_owned()
}

fn old_layout(snap: &Snapshot, origin: &Origin) -> String {
    let mut out = String::new();
    let src = match origin {
        Origin::Daemon(url) => format!("daemon {url}"),
        Origin::Direct { reason } => format!("NVML directly ({reason})"),
    };
    let driver = snap.nvml.driver_version.as_deref().unwrap_or("n/a");
    let _ = writeln!(out, "{}  driver {driver}  from {src}", snap.hostname);
    if !snap.nvml.up {
        let why = snap.nvml.error.as_deref().unwrap_or("no poll yet");
        let _ = writeln!(out, "NVML is down: {why}");
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:<26} {:>10} {:>10} {:>10} {:>10} {:>5} {:>6} {:>7}  STATE",
        "GPU", "NAME", "USED", "RESERVED", "FREE", "TOTAL", "UTIL", "TEMP", "POWER"
    );
    for g in &snap.gpus {
        let r = &g.reading;
        let m = r.memory;
        let state = match r.state {
            GpuState::Ok if r.mig_mode => "ok (MIG)".to_string(),
            GpuState::Ok => "ok".to_string(),
            GpuState::Lost => format!("LOST: {}", r.error.as_deref().unwrap_or("")),
            GpuState::Error => format!("ERROR: {}", r.error.as_deref().unwrap_or("")),
        };
        let _ = writeln!(
            out,
            "{:<4} {:<26} {:>10} {:>10} {:>10} {:>10} {:>5} {:>6} {:>7}  {state}",
            r.identity.index,
            old_truncate(&r.identity.name, 26),
            opt(m.map(|m| m.used), bytes),
            opt(m.map(|m| m.reserved), bytes),
            opt(m.map(|m| m.free), bytes),
            opt(m.map(|m| m.total), bytes),
            opt(r.utilization, |u| format!("{:.0}%", u * 100.0)),
            opt(r.temperature_celsius, |t| format!("{t:.0}C")),
            opt(r.power_watts, |w| format!("{w:.0}W")),
        );
    }
    // New with jobs, not part of what `format!` wrote.
    super::jobs::section(snap, &mut out);
    old_trainers(snap, &mut out);
    if snap.processes.is_empty() {
        let _ = writeln!(out, "\nno GPU processes");
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:>8} {:<12} {:<14} {:<16} {:<16} {:>10}",
        "GPU", "PID", "USER", "CONTAINER", "PROCESS", "KIND", "USED"
    );
    for p in &snap.processes {
        let _ = writeln!(
            out,
            "{:<4} {:>8} {:<12} {:<14} {:<16} {:<16} {:>10}",
            p.gpu,
            p.pid,
            old_truncate(p.info.user.as_deref().unwrap_or("n/a"), 12),
            old_truncate(p.info.container.as_deref().unwrap_or("-"), 14),
            old_truncate(p.info.name.as_deref().unwrap_or("n/a"), 16),
            p.kind.as_str(),
            opt(p.used_memory_bytes, bytes),
        );
    }
    out
}

/// Live trainer sessions grouped by job (then rank), each with its open findings, and the
/// messages of those findings below: what an engineer asks first of a node.
fn old_trainers(snap: &Snapshot, out: &mut String) {
    let mut live: Vec<_> = snap.sessions.iter().filter(|s| s.ended.is_none()).collect();
    if live.is_empty() {
        return;
    }
    live.sort_by(|a, b| (&a.job, a.rank, a.pid).cmp(&(&b.job, b.rank, b.pid)));
    let open = |session: &str| -> Vec<&crate::core::detect::Finding> {
        snap.findings
            .iter()
            .filter(|f| f.subject.session == session && f.state.open())
            .collect()
    };
    let _ = writeln!(
        out,
        "\n{:<20} {:>6} {:>4} {:>8} {:>9} {:>10} {:>10} {:>10}  FINDINGS",
        "JOB", "RANK", "GPU", "PID", "STEP", "ALLOCATED", "RESERVED", "OUTSIDE"
    );
    let mut messages = Vec::new();
    for s in &live {
        let rank = match (s.rank, s.world_size) {
            (Some(r), Some(w)) => format!("{r}/{w}"),
            (Some(r), None) => r.to_string(),
            _ => "-".into(),
        };
        let found = open(&s.session);
        let badges: Vec<String> = found
            .iter()
            .map(|f| format!("{} {}", f.kind.as_str(), f.state.as_str()))
            .collect();
        for f in &found {
            if !f.message.is_empty() {
                messages.push(format!(
                    "{} {}: {}",
                    s.job.as_deref().unwrap_or("-"),
                    f.kind.as_str(),
                    f.message
                ));
            }
        }
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>4} {:>8} {:>9} {:>10} {:>10} {:>10}  {}",
            old_truncate(s.job.as_deref().unwrap_or("-"), 20),
            rank,
            opt(s.gpu, |g| g.to_string()),
            s.pid,
            opt(s.step, |v| v.to_string()),
            opt(s.stats.and_then(|st| st.allocated), bytes),
            opt(s.stats.and_then(|st| st.reserved), bytes),
            // Memory of the process outside PyTorch's allocator (the API's ledger says why
            // when it cannot be known: "?").
            match &s.ledger {
                Some(l) => l.outside_allocator_bytes.map_or("?".into(), bytes),
                None => "-".into(),
            },
            if badges.is_empty() {
                "-".to_string()
            } else {
                badges.join(", ")
            },
        );
        // New with the memory split and the outside's reason, not part of what `format!` wrote.
        super::legend::outside_unknown(s, out);
        super::memory(s, out);
    }
    for m in messages {
        let _ = writeln!(out, "  {}", old_truncate(&m, 160));
    }
}

fn old_truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('~');
        t
    }
}

fn direct() -> Origin {
    Origin::Direct {
        reason: "--direct".into(),
    }
}

/// Names that fit, fit exactly, are one too long, are not ASCII (wide, combining, emoji),
/// hold controls (escaped before they are cut) or are missing.
const AWKWARD: [Option<&str>; 16] = [
    Some("python"),
    Some("abcdefghijkl"),
    Some("abcdefghijklm"),
    Some("abcdefghijklmn"),
    Some("abcdefghijklmnop"),
    Some("abcdefghijklmnopq"),
    Some("日本語のプロセス名前です長い名前"),
    Some("日本語のプロセス名前で"),
    Some("e\u{301}e\u{301}e\u{301}e\u{301}e\u{301}e\u{301}e\u{301}"),
    Some("🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀"),
    Some("ünïcödé-ßtraße-ø"),
    Some("evil\u{1b}[2J\u{1b}]0;x\u{7}"),
    Some("gro\u{202e}yp.org"),
    Some(""),
    Some("a\nb"),
    None,
];

fn awkward_node() -> Snapshot {
    let mut snap = fixtures::crowded("gpu-node-1", 3, 8, 3);
    let sizes = [
        None,
        Some(0),
        Some(1023),
        Some(1024),
        Some(1280),
        Some(1_048_575),
        Some(1 << 53),
        Some(u64::MAX),
    ];
    for (i, p) in snap.processes.iter_mut().enumerate() {
        let info = std::sync::Arc::make_mut(&mut p.reading.info);
        info.name = AWKWARD[i % AWKWARD.len()].map(str::to_string);
        info.user = AWKWARD[(i + 3) % AWKWARD.len()].map(str::to_string);
        info.container = AWKWARD[(i + 7) % AWKWARD.len()].map(str::to_string);
        p.reading.used_memory_bytes = sizes[i % sizes.len()].or(if i % 3 == 0 {
            None
        } else {
            Some(i as u64 * 987_654_321)
        });
        p.reading.kind = [
            crate::core::model::ProcessKind::Compute,
            crate::core::model::ProcessKind::Graphics,
            crate::core::model::ProcessKind::ComputeGraphics,
        ][i % 3];
        if i == 5 {
            p.reading.pid = u32::MAX;
            p.reading.gpu = 12_345;
        }
    }
    snap
}

#[test]
fn the_table_is_what_format_wrote() {
    let origins = [
        direct(),
        Origin::Daemon("http://127.0.0.1:9477/api/v1/snapshot".into()),
    ];
    let mut clean = awkward_node();
    for p in &mut clean.processes {
        let info = std::sync::Arc::make_mut(&mut p.reading.info);
        for field in [&mut info.name, &mut info.user, &mut info.container] {
            if field
                .as_deref()
                .is_some_and(|s| s.chars().any(crate::util::printable::escaped))
            {
                *field = Some("clean".into());
            }
        }
    }
    let mut down = fixtures::crowded("gpu-node-1", 1, 2, 0);
    down.nvml.up = false;
    down.nvml.error = Some("driver gone\u{1b}[2J".into());
    down.gpus[0].reading.identity.name = "NVIDIA H100 80GB HBM3 and a much longer name".into();
    let mut idle = fixtures::crowded("gpu-node-1", 2, 0, 0);
    idle.gpus[1].reading.state = crate::core::model::GpuState::Lost;
    idle.gpus[1].reading.error = Some("fell off the bus".into());
    for snap in [
        awkward_node(),
        clean,
        fixtures::crowded("n", 8, 16, 2),
        down,
        idle,
    ] {
        for origin in &origins {
            let (new, old) = (table(&snap, origin), old_table(&snap, origin));
            for (n, o) in new.lines().zip(old.lines()) {
                assert_eq!(n, o);
            }
            assert_eq!(new, old);
        }
    }
}

/// Every figure a byte count can take: each unit's ties (to even, as float formatting rounds),
/// the neighbours of each, the carry into the next whole number, and a spread of the rest.
#[test]
fn byte_counts_are_what_units_bytes_wrote() {
    let check = |b: u64| {
        let mut cell = String::new();
        push_bytes(&mut cell, b);
        assert_eq!(cell, bytes(b), "{b}");
    };
    for b in 0..5000 {
        check(b);
    }
    for unit in 1..=5u32 {
        let shift = 10 * unit;
        for tenths in 0..25_000u64 {
            // (tenths + 1/2) / 10 of the unit, and around it.
            let mid = ((2 * tenths + 1) << (shift - 1)) / 10;
            for b in mid.saturating_sub(2)..=mid + 2 {
                check(b);
            }
        }
        check((1 << shift) - 1);
        check(1 << shift);
        check((1024 << shift) - 1);
    }
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        check(x >> (x % 64));
    }
    for b in [
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        u64::MAX - 1,
        u64::MAX,
    ] {
        check(b);
    }
}

#[test]
fn cells_are_cut_and_padded_as_format_did() {
    let words = AWKWARD
        .iter()
        .flatten()
        .copied()
        .chain(["a", "ab", "~", "日", "日本"]);
    for s in words {
        for width in 1..40 {
            assert_eq!(truncate(s, width), old_truncate(s, width), "{s:?} {width}");
            let mut out = String::new();
            fit(&mut out, s, width);
            assert_eq!(out, format!("{:<width$}", old_truncate(s, width)), "{s:?}");
            for (align, want) in [
                (Align::Left, format!("{s:<width$}")),
                (Align::Right, format!("{s:>width$}")),
            ] {
                let mut out = String::new();
                pad(&mut out, s, width, align);
                assert_eq!(out, want, "{s:?} {width}");
            }
        }
    }
    for n in [0, 7, 10, 99, 4_294_967_295, u64::MAX] {
        let mut out = String::new();
        push_decimal(&mut out, n);
        assert_eq!(out, n.to_string());
    }
}
