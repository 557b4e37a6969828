use super::*;

#[test]
fn a_panic_restores_the_terminal_before_the_message_is_printed() {
    install_panic_hook();
    ACTIVE.store(true, Ordering::SeqCst);
    let r = std::panic::catch_unwind(|| panic!("boom (expected by this test)"));
    assert!(r.is_err());
    assert!(!ACTIVE.load(Ordering::SeqCst), "the hook ran restore()");
}
