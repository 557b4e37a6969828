use super::*;

#[test]
fn a_long_message_keeps_its_last_clause() {
    let m = "allocated floor grows 8.0 MiB/step since step 256 (+3.8 GiB so far); 98% of the growth in steps 337-357 was allocated at train.py:27 in kept_outputs";
    let c = clip_keeping_last(m, 140);
    assert_eq!(c.chars().count(), 140);
    assert!(
        c.ends_with(
            "; 98% of the growth in steps 337-357 was allocated at train.py:27 in kept_outputs"
        ),
        "{c}"
    );
    assert!(
        c.starts_with("allocated floor grows 8.0 MiB/step since step 256"),
        "{c}"
    );
    assert!(c.contains("…; 98% of the growth"), "{c}");
    // The head gives way before the clause does: at 114, a few of its words are left.
    let c = clip_keeping_last(m, 114);
    assert!(
        c.starts_with("allocated floor grows 8.0 MiB/")
            && c.ends_with("…; 98% of the growth in steps 337-357 was allocated at train.py:27 in kept_outputs"),
        "{c}"
    );
    // Narrower than the clause: its start goes, the place it names stays.
    let c = clip_keeping_last(m, 74);
    assert_eq!(c.chars().count(), 74, "{c}");
    assert!(c.starts_with("allocated floor grows 8.0 …; …was"), "{c}");
    assert!(c.ends_with(" at train.py:27 in kept_outputs"), "{c}");
    // Too narrow for any of that: cut at the end, as before.
    assert_eq!(clip_keeping_last(m, 20), clip(m, 20));
    // A last clause that names no line keeps its place only beside a third of the room.
    let eta = "allocated floor grows 2.0 MiB/step since step 610; at this rate the GPU is full in ~4h10m (step ~31,000)";
    assert_eq!(clip_keeping_last(eta, 74), clip(eta, 74));
    assert!(clip_keeping_last(eta, 90)
        .ends_with("…; at this rate the GPU is full in ~4h10m (step ~31,000)"));
    assert_eq!(clip_keeping_last("short", 20), "short");
}

#[test]
fn formats() {
    assert_eq!(duration(42.0), "42s");
    assert_eq!(duration(185.0), "3m05s");
    assert_eq!(duration(15_000.0), "4h10m");
    assert_eq!(duration(200_000.0), "2d07h");
    assert_eq!(duration(-1.0), "?");
    assert_eq!(thousands(31_000), "31,000");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1_234_567), "1,234,567");
    assert_eq!(clip("abcdef", 4), "abc…");
    assert_eq!(clip("abc", 4), "abc");
    assert_eq!(ago(100.0, 99.5), "now");
    assert_eq!(plural(1u64, "process"), "1 process");
    assert_eq!(plural(2u64, "process"), "2 processes");
    assert_eq!(plural(0u64, "GPU"), "0 GPUs");
}
