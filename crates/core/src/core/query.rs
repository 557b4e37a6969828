//! The reads the store answers between inputs, typed: what the JSON API, the in-process
//! readers and the alert thread's resend ask for, and what they get (copies they own, so
//! serialising them never holds the aggregator).

use crate::core::apply::Core;
use crate::core::detect::Finding;
use crate::core::snapshot::{SessionEntry, Snapshot};

pub enum Query {
    /// The JSON API's snapshot: `history` seconds of GPU history, or only what follows the
    /// cursor `since` (empty: none yet) when this daemon wrote it.
    Snapshot {
        hostname: String,
        history: f64,
        since: Option<String>,
    },
    /// One live or recently ended session by id.
    Session(String),
    /// A snapshot without history, with the collection count it was built at (`local`).
    Local { hostname: String },
    /// The firing findings, as alert sinks resend them.
    Firing,
}

pub enum Answer {
    Snapshot(Box<Snapshot>),
    Session(Option<Box<SessionEntry>>),
    Local(u64, Box<Snapshot>),
    Firing(Vec<Finding>),
}

impl Core {
    pub fn answer(&self, q: Query) -> Answer {
        let store = self.store();
        match q {
            Query::Snapshot {
                hostname,
                history,
                since,
            } => Answer::Snapshot(Box::new(Snapshot::build_since(
                store,
                &hostname,
                history,
                since.as_deref(),
            ))),
            Query::Session(id) => Answer::Session(SessionEntry::lookup(store, &id).map(Box::new)),
            Query::Local { hostname } => Answer::Local(
                store.generation(),
                Box::new(Snapshot::build(store, &hostname, 0.0)),
            ),
            Query::Firing => Answer::Firing(store.firing_resolved()),
        }
    }
}
