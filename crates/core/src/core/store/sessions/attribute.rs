//! Asking a trainer where its leak allocates (the `attribute` request, docs/protocol.md), and
//! what its `attribution` answer changes. Only clients that announced the capability are asked;
//! one window per session at a time, a cool-down between requests, a deadline after which an
//! unanswered window counts as failed, and no asking again once a trainer said it cannot.
//!
//! A replay (`gpumon analyze`) runs these same rules: its core asks as the daemon did, drops the
//! requests (nobody can answer), and the trace's recorded answers find the windows they
//! answered live.

use super::{push_event, Session, Sessions};
use crate::core::detect::attribution::Attribution;
use crate::core::model::Timestamp;
use crate::core::trainer::EventRecord;

/// An attribution whose id answers no open request (the connection replies `bad_field`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("id {id} answers no open request; send an attribution only to answer an attribute request, with its id")]
pub struct Unasked {
    pub id: u64,
}

/// Growth a window should see: enough for the growing sites to stand well clear of the noise.
const TARGET_GROWTH: f64 = 32.0 * 1048576.0;
/// Fewest steps a window lasts.
const MIN_STEPS: u64 = 20;
/// Added to twice the window's seconds before an unanswered window counts as failed.
const GRACE_SECONDS: f64 = 60.0;

/// The `[attribution]` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttributionPolicy {
    /// Whether leak findings are attributed at all.
    pub enabled: bool,
    /// A window lasts at most this many steps (fewer for a fast leak)...
    pub window_steps: u64,
    /// ...or this many seconds, whichever comes first.
    pub window_seconds: f64,
    /// Allocation records the trainer keeps while recording.
    pub max_entries: u64,
    /// Sites the trainer reports at most.
    pub top: u64,
    /// Seconds between two requests to one session, at least.
    pub cooldown_seconds: f64,
}

impl Default for AttributionPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            window_steps: 200,
            window_seconds: 120.0,
            max_entries: 4000,
            top: 10,
            cooldown_seconds: 600.0,
        }
    }
}

/// An `attribute` request to send, as the protocol names its fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: u64,
    pub finding: String,
    pub steps: u64,
    pub seconds: f64,
    pub max_entries: u64,
    pub top: u64,
}

/// One session's side: whether it can be asked, and the window it was asked for.
#[derive(Debug, Clone, Default)]
pub struct Asking {
    /// The hello listed `attribution`.
    capable: bool,
    /// The trainer answered `unavailable`: it is not asked again.
    unavailable: bool,
    last_id: u64,
    open: Option<Window>,
    last_request: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq)]
struct Window {
    id: u64,
    finding: String,
    sent: Timestamp,
    deadline: Timestamp,
}

impl Asking {
    pub fn new(capable: bool) -> Self {
        Self {
            capable,
            ..Self::default()
        }
    }

    pub fn capable(&self) -> bool {
        self.capable
    }

    /// The connection's next request id: `attribute` and `arm` requests share one counter, so
    /// an answer's id names one request.
    pub(super) fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// The open window's request id and finding.
    pub fn open(&self) -> Option<(u64, &str)> {
        self.open.as_ref().map(|w| (w.id, w.finding.as_str()))
    }

    /// The request due now for the leak finding `leak` (its id and rate), if any.
    fn due(
        &mut self,
        p: &AttributionPolicy,
        leak: Option<(&str, Option<f64>)>,
        now: Timestamp,
    ) -> Option<Request> {
        if !self.capable || self.unavailable || self.open.is_some() {
            return None;
        }
        let (finding, slope) = leak?;
        if self
            .last_request
            .is_some_and(|t| now - t < p.cooldown_seconds)
        {
            return None;
        }
        let id = self.next_id();
        self.last_request = Some(now);
        self.open = Some(Window {
            id,
            finding: finding.to_string(),
            sent: now,
            deadline: now + 2.0 * p.window_seconds + GRACE_SECONDS,
        });
        Some(Request {
            id,
            finding: finding.to_string(),
            steps: steps_for(slope, p.window_steps),
            seconds: p.window_seconds,
            max_entries: p.max_entries,
            top: p.top,
        })
    }
}

/// Steps for about `TARGET_GROWTH` of growth at `slope` bytes a step, between `MIN_STEPS` and
/// the configured window; the whole window when the rate is unknown.
pub fn steps_for(slope: Option<f64>, window_steps: u64) -> u64 {
    let lo = MIN_STEPS.min(window_steps);
    match slope.filter(|s| s.is_finite() && *s > 0.0) {
        Some(s) => ((TARGET_GROWTH / s).ceil() as u64).clamp(lo, window_steps),
        None => window_steps,
    }
}

/// "93% at train.py:27 in kept_outputs": the top site, as a session event says it.
fn summary(a: &Attribution) -> String {
    match a.top() {
        Some(top) => format!(
            "{:.0}% at {} in {}",
            a.share(top) * 100.0,
            top.short(),
            top.function
        ),
        None => "no allocation site in the trainer's code grew over the window".into(),
    }
}

pub(super) fn event(sess: &mut Session, ts: Timestamp, kind: &str, detail: String) {
    push_event(
        sess,
        EventRecord {
            ts,
            kind: kind.into(),
            detail: Some(detail),
            alloc_bytes: None,
            device_free: None,
            alloc_limit: None,
        },
    );
}

impl Sessions {
    /// The `[attribution]` settings (the defaults until set).
    pub fn with_attribution(mut self, policy: AttributionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The request session `key` should send now, if one is due: its leak finding is pending or
    /// firing without an attribution, the trainer can be asked, no window is open and the
    /// cool-down has passed. Also closes a window past its deadline as failed.
    pub fn request_due(&mut self, key: u64, now: Timestamp) -> Option<Request> {
        let policy = self.policy;
        let sess = self.live.get_mut(&key)?;
        if sess.asking.open.as_ref().is_some_and(|w| now > w.deadline) {
            if let Some(w) = sess.asking.open.take() {
                let detail = format!(
                    "no answer: request {} for {} unanswered after {:.0} s",
                    w.id,
                    w.finding,
                    now - w.sent
                );
                event(sess, now, "attribution_failed", detail);
            }
        }
        // A leak this daemon will not ask about says why it names no line.
        let cannot = if !policy.enabled {
            Some("attribution is off in the daemon's config ([attribution] enabled = false)")
        } else if !sess.asking.capable {
            Some("the trainer's client does not record allocation history (its hello announced no `attribution`)")
        } else {
            None
        };
        if let Some(why) = cannot {
            let clause = crate::core::detect::message::no_line(why);
            sess.detect.no_line(None, clause, now, &mut self.findings);
            return None;
        }
        let leak = sess
            .detect
            .leak()
            .filter(|f| f.attribution.is_none())
            .map(|f| (f.id.as_str(), f.evidence.slope_bytes_per_step));
        let req = sess.asking.due(&policy, leak, now)?;
        let detail = format!(
            "asked for {} steps or {} s of allocation history for {} (request {})",
            req.steps, req.seconds, req.finding, req.id
        );
        event(sess, now, "attribution_requested", detail);
        Some(req)
    }

    /// An `attribution` from session `key`'s trainer. It must answer the open window, else it
    /// is a `bad_field` and nothing changes; it closes the window, and its sites go on the leak
    /// finding it was asked for while that is pending or firing.
    pub fn attribution(&mut self, key: u64, mut a: Attribution) -> Result<(), Unasked> {
        let Some(sess) = self.live.get_mut(&key) else {
            return Ok(());
        };
        let finding = match sess.asking.open.as_ref() {
            Some(w) if w.id == a.id => sess.asking.open.take().map(|w| w.finding),
            _ => return Err(Unasked { id: a.id }),
        };
        a.finding = finding.clone();
        match a.error.as_deref() {
            Some(error) => {
                if error == "unavailable" {
                    sess.asking.unavailable = true;
                }
                let detail = format!("{error}: {}", a.detail.as_deref().unwrap_or(""));
                event(sess, a.ts, "attribution_failed", detail);
                // The finding says why it names no line, wherever it is shown.
                sess.detect
                    .unattributed(finding.as_deref(), &a, &mut self.findings);
            }
            None => {
                // Only the finding asked about takes it: a leak raised again meanwhile is
                // another finding, measured over other steps.
                sess.detect
                    .attribute(finding.as_deref(), &a, &mut self.findings);
                event(sess, a.ts, "attribution", summary(&a));
            }
        }
        sess.attribution = Some(a);
        Ok(())
    }
}

impl Session {
    /// The session ends: an open window will never be answered. The finding stays as it is.
    pub(super) fn end_window(&mut self, now: Timestamp) {
        if let Some(w) = self.asking.open.take() {
            let detail = format!(
                "cut_short: the session ended before request {} for {} was answered",
                w.id, w.finding
            );
            event(self, now, "attribution_failed", detail);
        }
    }
}

// Its tests check the reply a trainer gets (ingest's protocol), so they live in the gpumon crate
// (src/core/tests/attribute.rs).
