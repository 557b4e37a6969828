use super::*;

#[test]
fn gauge_adds_up_to_its_width() {
    let t = Theme::new(false);
    for w in [1u16, 7, 40, 77] {
        let l = gauge(21 << 30, 541 << 20, 80 << 30, w, t);
        assert_eq!(l.width(), usize::from(w));
    }
}
