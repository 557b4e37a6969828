//! What the daemon serves: Prometheus text and the JSON API over HTTP.

pub mod http;
pub mod prometheus;
