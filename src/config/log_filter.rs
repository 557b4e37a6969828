//! `log_level` checking. tracing's filter syntax reads a bare word as a target name, so a level
//! misspelt as "warning" or "verbose" parses fine and then matches no event at all: the daemon
//! would log nothing, errors included. Here every directive's level must be a real level, and a
//! bare word must be a level.

use std::str::FromStr;

use tracing_subscriber::filter::LevelFilter;

const LEVELS: &str = "trace, debug, info, warn, error, off";

/// Why `filter` would hide logs the user meant to see, or None when it is a usable filter.
pub fn problem(filter: &str) -> Option<String> {
    let directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Some(format!(
            "an empty filter logs nothing; use a level ({LEVELS}) or a filter like \"info,gpumon=debug\""
        ));
    }
    for d in directives {
        if let Some(why) = directive_problem(d) {
            return Some(why);
        }
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(filter) {
        return Some(format!(
            "{e}; use a level like \"info\" or a filter like \"gpumon=debug\""
        ));
    }
    None
}

fn directive_problem(d: &str) -> Option<String> {
    // `target[span{field=value}]=level`: a `=` inside the brackets is not the level's.
    let tail = d.rfind(']').map_or(d, |i| &d[i + 1..]);
    let level = match tail.rfind('=') {
        Some(i) => &tail[i + 1..],
        // `target[span]` with no level enables every level for that span: real syntax.
        None if d.contains('[') => return None,
        None if is_level(d) => return None,
        None => {
            return Some(format!(
                "{d:?} is not a level{hint}; levels are {LEVELS}, and a target needs one too, e.g. \"{d}=debug\"",
                hint = suggestion(d)
            ))
        }
    };
    if is_level(level) {
        None
    } else {
        Some(format!(
            "{level:?} in {d:?} is not a level{hint}; levels are {LEVELS}",
            hint = suggestion(level)
        ))
    }
}

fn is_level(s: &str) -> bool {
    !s.trim().is_empty() && LevelFilter::from_str(s.trim()).is_ok()
}

/// The level a common misspelling meant.
fn suggestion(word: &str) -> &'static str {
    match word.trim().to_ascii_lowercase().as_str() {
        "warning" | "warnings" => " (did you mean \"warn\"?)",
        "err" | "errors" | "fatal" | "critical" => " (did you mean \"error\"?)",
        "verbose" | "all" => " (did you mean \"debug\" or \"trace\"?)",
        "information" | "notice" => " (did you mean \"info\"?)",
        "none" | "quiet" => " (did you mean \"off\"?)",
        _ => "",
    }
}
