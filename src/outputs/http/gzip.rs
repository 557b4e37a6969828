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
mod tests;
