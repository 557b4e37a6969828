use super::*;

#[test]
fn one_span_rule_to_the_second_or_coarse() {
    for (secs, fine, coarse) in [
        (42.0, "42s", "42s"),
        (185.0, "3m05s", "3m"),
        (15_000.0, "4h10m", "4h10m"),
        (183_600.0, "2d03h", "2d03h"),
    ] {
        assert_eq!(duration(secs), fine);
        assert_eq!(duration_coarse(secs), coarse);
    }
    assert_eq!(duration(-1.0), "?");
    assert_eq!(duration_coarse(f64::NAN), "?");
    assert_eq!(thousands(31_000), "31,000");
    assert_eq!(thousands(999), "999");
}

#[test]
fn formats_binary_units() {
    assert_eq!(bytes(0), "0 B");
    assert_eq!(bytes(1023), "1023 B");
    assert_eq!(bytes(1536), "1.5 KiB");
    assert_eq!(bytes(85_520_809_984), "79.6 GiB");
    assert_eq!(opt(None::<u64>, bytes), "n/a");
    assert_eq!(bytes_fine(5_100_273_664), "4.75 GiB");
    assert_eq!(bytes_fine(402_653_184), "384.0 MiB");
    assert_eq!(bytes_fine(10_736_000_000), "10.0 GiB");
    assert_eq!(bytes_fine(1000), "1000 B");
}
