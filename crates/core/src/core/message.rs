//! What a trainer's line says once parsed: the ingest protocol parses into this, and the core
//! applies it (`core::apply`). Its payloads are the domain's own types.

use crate::core::detect::attribution::Attribution;
use crate::core::detect::peak::Peak;
use crate::core::store::sessions::ArmAnswer;
use crate::core::trainer::{Event, Hello, Sample};

#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Hello(Hello),
    Sample(Sample),
    Event(Event),
    /// The answer to an `attribute` request; `finding` is left for the daemon to fill in.
    Attribution(Attribution),
    /// The answer to an `arm` request: recording, or why not.
    Armed(ArmAnswer),
    /// What was live at the step peak, for an armed near_limit; `finding` left to the daemon.
    Peak(Peak),
    Bye {
        ts: Option<f64>,
    },
}
