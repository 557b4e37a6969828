#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn accept_encoding_is_read_with_q_values() {
    let ok = |s: &str| accepts_gzip([&HeaderValue::from_str(s).unwrap()]);
    assert!(ok("gzip"));
    assert!(ok("deflate, GZIP;q=0.5"));
    assert!(ok("gzip, deflate, br"));
    assert!(ok("x-gzip"));
    assert!(ok("*"));
    assert!(ok("br;q=1.0, gzip;q=0.8, *;q=0.1"));
    assert!(!ok("gzip;q=0"));
    assert!(!ok("gzip;q=0.000, *"));
    assert!(!ok("identity"));
    assert!(!ok("br, deflate"));
    assert!(!ok("*;q=0"));
    assert!(!ok(""));
    assert!(!accepts_gzip([]));
}
