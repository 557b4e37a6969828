#![allow(clippy::unwrap_used)]
use super::*;
use std::io::Read;

fn gunzip(data: &[u8]) -> Vec<u8> {
    // GzDecoder reads one member only (as many readers do) and checks its CRC and length.
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn prefix_and_tail_make_one_valid_member() {
    let big: String = (0..20_000)
        .map(|i| {
            format!(
                "gpumon_process_memory_used_bytes{{pid=\"{i}\"}} {}\n",
                i * 7
            )
        })
        .collect();
    let prefix = GzPrefix::new(big.as_bytes()).unwrap();
    for tail in ["", "gpumon_http_connections 3\n", &big[..5000]] {
        let gz = prefix.with_tail(tail.as_bytes()).unwrap();
        assert_eq!(gunzip(&gz), format!("{big}{tail}").into_bytes());
    }
    assert!(
        prefix.len() * 5 < big.len(),
        "{} of {}",
        prefix.len(),
        big.len()
    );
    let empty = GzPrefix::new(b"").unwrap();
    assert_eq!(gunzip(&empty.with_tail(b"x 1\n").unwrap()), b"x 1\n");
}
