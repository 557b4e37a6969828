//! Whether a scraper takes gzip; the /metrics text is compressed by the exporter
//! (outputs/prometheus/gzip.rs).

use axum::http::header::HeaderValue;

/// Whether the Accept-Encoding values allow gzip: `gzip` (or `x-gzip`, or `*` when gzip is not
/// named) with a q-value above 0 (RFC 9110 12.5.3).
pub fn accepts_gzip<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> bool {
    let mut star = false;
    for value in values {
        let Ok(text) = value.to_str() else { continue };
        for item in text.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("q").then(|| v.trim())
                })
                .next_back()
                .map(|v| v.parse::<f64>().unwrap_or(0.0))
                .unwrap_or(1.0);
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                return q > 0.0;
            }
            if coding == "*" {
                star = q > 0.0;
            }
        }
    }
    star
}

#[cfg(test)]
mod tests {
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
}
