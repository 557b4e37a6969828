//! The words a trainer uses for its phase and its events, as enums with an escape for the free
//! words the protocol allows; each is written back exactly as it was read.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What the trainer was doing at a sample. The protocol allows any short word; detectors judge
/// training steps only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Also what an absent `phase` means.
    #[default]
    Train,
    Eval,
    Other(String),
}

impl Phase {
    pub fn parse(word: &str) -> Self {
        match word {
            "train" => Phase::Train,
            "eval" => Phase::Eval,
            other => Phase::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Phase::Train => "train",
            Phase::Eval => "eval",
            Phase::Other(w) => w,
        }
    }

    pub fn is_train(&self) -> bool {
        *self == Phase::Train
    }
}

/// What an event says happened: the protocol's kinds, the daemon's own, or a trainer's word.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The allocator's OOM observer fired.
    Oom,
    /// The trainer changed phase (`phase` on the event).
    Phase,
    /// A free-form annotation (`detail`); the reference client reports drops on one.
    Mark,
    /// A memory snapshot file was written (`path`).
    Snapshot,
    /// The daemon's: the connection closed without bye.
    Crash,
    /// The daemon's: the connection was closed for idling (`ingest.idle_timeout_seconds`).
    IdleTimeout,
    /// The daemon's: asked the trainer where its growing memory is allocated, and the answers.
    AttributionRequested,
    Attribution,
    AttributionFailed,
    Other(String),
}

impl EventKind {
    const NAMED: [(EventKind, &'static str); 9] = [
        (EventKind::Oom, "oom"),
        (EventKind::Phase, "phase"),
        (EventKind::Mark, "mark"),
        (EventKind::Snapshot, "snapshot"),
        (EventKind::Crash, "crash"),
        (EventKind::IdleTimeout, "idle_timeout"),
        (EventKind::AttributionRequested, "attribution_requested"),
        (EventKind::Attribution, "attribution"),
        (EventKind::AttributionFailed, "attribution_failed"),
    ];

    pub fn parse(word: &str) -> Self {
        Self::NAMED
            .iter()
            .find(|(_, w)| *w == word)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| EventKind::Other(word.to_string()))
    }

    pub fn as_str(&self) -> &str {
        match self {
            EventKind::Other(w) => w,
            known => Self::NAMED
                .iter()
                .find(|(k, _)| k == known)
                .map_or("", |(_, w)| w),
        }
    }
}

/// Compared by the word it is written as.
impl PartialEq<&str> for EventKind {
    fn eq(&self, word: &&str) -> bool {
        self.as_str() == *word
    }
}

impl PartialEq<&str> for Phase {
    fn eq(&self, word: &&str) -> bool {
        self.as_str() == *word
    }
}

impl From<&str> for EventKind {
    fn from(word: &str) -> Self {
        EventKind::parse(word)
    }
}

impl From<&str> for Phase {
    fn from(word: &str) -> Self {
        Phase::parse(word)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for Phase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Phase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Phase::parse(&String::deserialize(d)?))
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(EventKind::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests;
