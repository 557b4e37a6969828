//! Strings a hostile trainer (or whatever answers on the daemon's port) sends, to be shown to a
//! person: the one list every output is tried with (status, analyze, the TUI, the log, errors;
//! the unit tests of the escaping rule read it too). Each starts with two letters and then,
//! within its first eight characters, a character that must be escaped, so that even a column
//! cut short shows the escape.

pub const HOSTILE: &[&str] = &[
    // Clear the screen and home the cursor (CSI).
    "cl\u{1b}[2J\u{1b}[Hclear",
    // Retitle the window (OSC 0, ended by BEL).
    "ti\u{1b}]0;PWNED\u{7}title",
    // A hyperlink whose target is not the text (OSC 8, ended by ST).
    "ln\u{1b}]8;;https://evil.example/\u{1b}\\click\u{1b}]8;;\u{1b}\\",
    // Write the clipboard (OSC 52).
    "cb\u{1b}]52;c;cm0gLXJmIH4=\u{7}",
    // Device control and application strings (DCS, APC).
    "dc\u{1b}P+q544e\u{1b}\\\u{1b}_apc\u{1b}\\",
    // One-character C1 CSI, OSC and ST.
    "c1\u{9b}2J\u{9d}0;x\u{9c}",
    // Forge a line of its own (CR, LF), and the other C0 and DEL.
    "cr\rFORGED\nFORGED",
    "bs\u{8}\t\u{7f}\u{0}\u{c}\u{b}",
    // Trojan Source: shown `gro.py` for `yp.org`; and the isolates.
    "ro\u{202e}yp.org",
    "is\u{2066}\u{2067}x\u{2068}\u{2069}",
    // The invisible bidirectional marks: LRM, RLM, ALM.
    "mk\u{200e}\u{200f}\u{61c}marks",
    // The line and paragraph separators.
    "ls\u{2028}line\u{2029}para",
    // Zero-width space, joiners, byte-order mark.
    "zw\u{200b}sp\u{feff}\u{200c}\u{200d}",
    // Word joiner, invisible operators, Mongolian vowel separator, soft hyphen.
    "iv\u{2060}\u{2061}\u{2062}\u{2063}\u{2064}\u{180e}\u{ad}",
    // Tags: invisible ASCII ("AB"), then the cancel tag.
    "tg\u{e0041}\u{e0042}\u{e007f}",
    // A Hangul filler (blank, two columns) and a variation selector.
    "hf\u{3164}\u{fe0f}fill",
];

/// `shown` from its start through its first escape (`\u{…}`): what must be visible even where
/// a column cuts the rest.
pub fn first_escape(shown: &str) -> &str {
    let at = shown.find("\\u{").expect("an escape");
    let end = shown[at..].find('}').expect("a closing brace") + at + 1;
    &shown[..end]
}
