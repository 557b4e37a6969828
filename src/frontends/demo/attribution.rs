//! The demo trainers' answer to the daemon's `attribute` request (docs/protocol.md), as the
//! reference client gives it: one recorded step, a first snapshot, `steps` steps or `seconds`
//! (whichever first), a second snapshot, and the diff's sites. A simulated trainer has no
//! allocator to snapshot, so its sites come from its profile: the leak's output kept at
//! train.py:27, one block of the profile's per-step growth each step; the others keep nothing.

use serde_json::Value;

use super::profile::Profile;
use crate::core::detect::attribution::{Attribution, Frame, Site};

/// The daemon's request, the fields this trainer uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: u64,
    pub steps: u64,
    pub seconds: f64,
    pub top: usize,
}

impl Request {
    /// An `attribute` line this trainer can answer; None for anything else the daemon sends
    /// (welcome, error, a request version it does not speak).
    pub fn parse(line: &str) -> Option<Request> {
        let v: Value = serde_json::from_str(line).ok()?;
        if v["type"] != "attribute" || v.get("v").is_some_and(|x| x != 1) {
            return None;
        }
        Some(Request {
            id: v["id"].as_u64()?,
            steps: v["steps"].as_u64()?.max(1),
            seconds: v["seconds"].as_f64()?,
            top: v["top"].as_u64().map_or(10, |n| n as usize),
        })
    }
}

/// A snapshot: the step, when, and the live (active) bytes the samples showed then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    pub step: u64,
    pub ts: f64,
    pub active: u64,
}

/// An open window: asked at one step, first snapshot at the next.
#[derive(Debug)]
pub struct Window {
    req: Request,
    asked_at: u64,
    from: Option<Mark>,
    last: Option<Mark>,
}

impl Window {
    pub fn new(req: Request, step: u64) -> Self {
        Self {
            req,
            asked_at: step,
            from: None,
            last: None,
        }
    }

    pub fn id(&self) -> u64 {
        self.req.id
    }

    /// Called at each step's sample; the `attribution` line when the window closes.
    pub fn on_step(&mut self, profile: Profile, now: Mark) -> Option<Value> {
        self.last = Some(now);
        let Some(from) = self.from else {
            // One step went by recorded: what every step allocates now carries a stack.
            if now.step > self.asked_at {
                self.from = Some(now);
            }
            return None;
        };
        let done = now.step >= from.step + self.req.steps || now.ts - from.ts >= self.req.seconds;
        done.then(|| answer(profile, &self.req, from, now))
    }

    /// The answer when the trainer stops (`why`) with this window open, as the real client
    /// words it: how far the window got, and its steps and seconds so far once it had begun.
    pub fn cut_short(&self, ts: f64, why: &str) -> Value {
        let mut a = error(self.req.id, ts, "cut_short", "");
        let detail = match (self.from, self.last) {
            (Some(from), Some(last)) => {
                a["step_from"] = from.step.into();
                a["step_to"] = last.step.into();
                a["seconds"] = millis(last.ts - from.ts).into();
                format!(
                    "{why}, {} step(s) into the window",
                    last.step.saturating_sub(from.step)
                )
            }
            _ => format!("{why}, before the window began (recording, its first step not over)"),
        };
        a["detail"] = detail.into();
        a
    }
}

/// The answer to `req` while a window is open: one at a time, said at once rather than left to
/// the daemon's timeout (the real client's wording).
pub fn busy(req: &Request, open: &Window, ts: f64) -> Value {
    error(
        req.id,
        ts,
        "failed",
        &format!("a window is already open (request {})", open.id()),
    )
}

/// An answer without sites: the error and why (like the real client's, it carries no total).
fn error(id: u64, ts: f64, error: &str, detail: &str) -> Value {
    serde_json::json!({"type": "attribution", "id": id, "ts": ts, "error": error, "detail": detail})
}

/// Seconds rounded to the millisecond, as the real client sends them.
fn millis(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// The `attribution` line for a window from `from` to `to`.
pub fn answer(profile: Profile, req: &Request, from: Mark, to: Mark) -> Value {
    let steps = to.step.saturating_sub(from.step);
    let sites = profile
        .leak_per_step()
        .filter(|_| steps > 0)
        .map(|per_step| leak_site(per_step, steps))
        .into_iter()
        .take(req.top)
        .collect();
    let a = Attribution {
        id: req.id,
        ts: to.ts,
        finding: None,
        step_from: Some(from.step),
        step_to: Some(to.step),
        seconds: Some(millis(to.ts - from.ts)),
        // All live memory, as the samples showed it: the leak plus the floor's jitter.
        total_growth_bytes: to.active.saturating_sub(from.active),
        sites,
        error: None,
        detail: None,
    };
    let mut v = serde_json::to_value(&a).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("type".into(), "attribution".into());
    }
    v
}

/// The demo trainers' script, as the frames name it.
pub const TRAIN: &str = "/home/alice/proj/train.py";

/// The leak: each step's output (the last ReLU of an `nn.Sequential`) appended to a list at
/// train.py:27. Its stack is the one torch 2.11 recorded for that allocation on an H100
/// (tests/fixtures/torch-snapshots) as the real client reports it: the site's frame first, then
/// the user frames outward (torch's own frames inside it are dropped). The OOM's explanation
/// names it too, as what holds the memory (oom.rs).
pub fn leak_site(per_step: u64, steps: u64) -> Site {
    let user = |line, function: &str| Frame {
        file: TRAIN.into(),
        line,
        function: function.into(),
    };
    Site {
        file: TRAIN.into(),
        line: 27,
        function: "kept_outputs".into(),
        bytes: per_step * steps,
        blocks: steps,
        stack: vec![
            user(27, "kept_outputs"),
            user(48, "run"),
            user(69, "<module>"),
        ],
        note: None,
    }
}

#[cfg(test)]
mod tests;
