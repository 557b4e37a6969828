//! What the daemon serves: Prometheus text and the JSON API over HTTP, and the words every
//! output uses for a leak's attribution, a near_limit's step peak and an OOM's explanation.

pub mod alerts;
pub mod attribution_text;
pub mod explanation_text;
pub mod http;
pub mod peak_text;
pub mod prometheus;
pub mod record;
