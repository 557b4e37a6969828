//! What the core takes in and gives back (`Core::apply`): an NVML collection, a batch of one
//! connection's parsed lines, a connection's close, or a note read back from a trace. Typed, so
//! every change to the state is one of these and the rules live in one place (apply.rs).

use crate::core::message::Message;
use crate::core::model::Timestamp;
use crate::core::store::sessions::nvml::NvmlFigure;
use crate::core::store::sessions::{ArmLine, Request as AttributeRequest, Unasked, UnaskedArm};
use crate::core::store::Collection;
use crate::core::trainer::Peer;

// A collection is boxed (it is large); the rest are small or boxed already.
pub enum Input {
    Collection(Box<Collection>),
    Lines(Box<Lines>),
    Close(Close),
    /// A trace's note replayed (`gpumon analyze`).
    Note(Link, Note),
}

/// What the core gives back for an input.
pub enum Output {
    /// A collection or a note: nothing to answer.
    Applied,
    /// The batch, with `applied` and `requests` filled and its link moved on.
    Lines(Box<Lines>),
    Closed(Closed),
}

impl Output {
    pub fn into_lines(self) -> Option<Box<Lines>> {
        match self {
            Output::Lines(l) => Some(l),
            _ => None,
        }
    }

    pub fn into_closed(self) -> Option<Closed> {
        match self {
            Output::Closed(c) => Some(c),
            _ => None,
        }
    }
}

/// A connection as the core knows it between its inputs; the connection keeps it and sends it
/// with each one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub peer: Peer,
    /// Its session, once a hello opened one (until bye or close).
    pub session: Option<u64>,
    /// Its session is recorded: a hello's answer then carries what the trace header needs, and
    /// a sample's the NVML note to write before it.
    pub recorded: bool,
    /// NVML's figure for the session as its trace last noted it.
    pub nvml_noted: Option<NvmlFigure>,
    /// The unified device's figures as the session's trace last noted them (unified.rs).
    pub unified_noted: Option<crate::core::unified::Room>,
}

impl Link {
    pub fn new(peer: Peer) -> Self {
        Self {
            peer,
            session: None,
            recorded: false,
            nvml_noted: None,
            unified_noted: None,
        }
    }
}

/// One connection's parsed lines, applied in order as one input (one hand-off per read, not
/// per line). The vectors travel there and back and are reused.
pub struct Lines {
    pub link: Link,
    pub now: Timestamp,
    pub messages: Vec<Message>,
    /// One per message, in order.
    pub applied: Vec<Applied>,
    /// Whether to ask, after the lines, for the requests due to the session.
    pub ask: bool,
    pub requests: Vec<Request>,
    /// The id a hello among these lines opens its session under: a replay's, the id the daemon
    /// gave it (from its trace); none, the store's own numbering (the daemon's).
    pub session_id: Option<String>,
}

impl Lines {
    pub fn new(link: Link) -> Self {
        Self {
            link,
            session_id: None,
            now: 0.0,
            messages: Vec::new(),
            applied: Vec::new(),
            ask: false,
            requests: Vec::new(),
        }
    }
}

/// What became of one message.
#[derive(Debug, PartialEq)]
pub enum Applied {
    /// A hello opened a session.
    Opened(Box<Opened>),
    /// Taken; for a recorded sample, the `trace_nvml` note to write before it.
    Accepted {
        note: Option<Vec<u8>>,
    },
    Refused(Refusal),
    /// Bye: the session ended cleanly.
    Ended,
}

/// A session a hello opened: its id and, when recorded, what its trace begins with.
#[derive(Debug, PartialEq)]
pub struct Opened {
    pub id: String,
    pub job: Option<String>,
    pub rank: Option<u64>,
    /// The `trace_gpu` line to follow the hello in the trace header: the GPU the trainer's
    /// device is, as NVML last listed it.
    pub trace_gpu: Option<Vec<u8>>,
}

/// A message the session's state does not allow.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    NoHello,
    DuplicateHello,
    /// An attribution that answers no open request.
    Unasked(Unasked),
    /// An `armed` or `peak` that answers no open arm request.
    UnaskedArm(UnaskedArm),
}

/// A request due to the trainer.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Attribute(AttributeRequest),
    Arm(ArmLine),
}

/// A connection ending without bye (or after it: then nothing is left to end).
pub struct Close {
    pub link: Link,
    pub how: Closing,
    pub now: Timestamp,
}

/// How a connection's session ends when the connection does.
#[derive(Debug, Clone, PartialEq)]
pub enum Closing {
    /// The connection closed without bye: the trainer exited or was killed.
    Crash,
    /// The daemon is stopping: the trainer may go on, so no crash.
    DaemonStopped,
    /// The daemon closed a quiet connection (`detail` says why): the trainer may be alive.
    Idle(String),
}

/// A close applied: the note its trace ends with, when recorded.
pub struct Closed {
    pub note: Option<Vec<u8>>,
}

/// What a trace holds beside the trainer's lines, put back on replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// `trace_nvml`: NVML's figure for the session then.
    Nvml(Option<NvmlFigure>),
    /// `trace_gpu`: the GPU index the daemon resolved the session's device to.
    Gpu(u32),
    /// `trace_unified`: the unified device's figures for the session's samples (unified.rs).
    Unified(Option<crate::core::unified::Room>),
}
