//! The one HTTP fact config and the server must agree on, kept below both so that config can
//! check `http.max_request_head_bytes` without reaching up into the server.

/// Smallest request-head buffer, in bytes: hyper panics on a smaller read buffer.
pub const MIN_HEAD_BYTES: usize = 8192;
