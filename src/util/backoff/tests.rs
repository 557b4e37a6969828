use super::*;

#[test]
fn doubles_to_the_cap_and_resets_to_the_floor() {
    let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
    let waits: Vec<u64> = (0..6).map(|_| b.fail().as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
    b.reset();
    assert_eq!(b.fail(), Duration::from_secs(1));
    assert_eq!(b.current(), Duration::from_secs(2));
}

#[test]
fn a_cap_below_the_floor_is_the_floor() {
    let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
    assert_eq!(b.fail(), Duration::from_secs(5));
    assert_eq!(b.fail(), Duration::from_secs(5));
}
