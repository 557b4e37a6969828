//! A job's failures in words, one wording for every output that tells them (`gpumon status`,
//! the TUI, `gpumon analyze`): a failure past the cascade window reads the same everywhere.

use super::view::{who, FailureRef};
use crate::units::duration_coarse;

/// What the failures past the cascade window are called: not explained by the first failure.
pub const LATER: &str = "failed past the cascade window";

/// One failure after the first: `rank 3 crash +75 s`, `rank 4 oom +2m` (the host, where a
/// reader needs it, is the reader's to add: one node's daemon would repeat its own name).
pub fn failure_ref(f: &FailureRef) -> String {
    let who = who(f.rank, &f.session);
    format!("{who} {} +{}", f.kind, after(f.after_seconds))
}

/// `1.5 s` under a minute (a cascade is seconds long), `2m` or `1h05m` past it.
fn after(secs: f64) -> String {
    if secs.is_finite() && secs < 60.0 {
        format!("{:.1} s", secs.max(0.0))
    } else {
        duration_coarse(secs)
    }
}

/// The first `named` of `failures`, the rest counted: `rank 3 crash +75 s, rank 4 crash +2m,
/// 2 more`.
pub fn failure_refs(failures: &[FailureRef], named: usize) -> String {
    let mut parts: Vec<String> = failures.iter().take(named).map(failure_ref).collect();
    if failures.len() > named {
        parts.push(format!("{} more", failures.len() - named));
    }
    parts.join(", ")
}

/// `failed past the cascade window: rank 3 crash +75 s, ...`; None when every failure was
/// within it.
pub fn later_failures(failures: &[FailureRef], named: usize) -> Option<String> {
    (!failures.is_empty()).then(|| format!("{LATER}: {}", failure_refs(failures, named)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::detect::Kind;

    fn later(rank: Option<u64>, after_seconds: f64, host: Option<&str>) -> FailureRef {
        FailureRef {
            rank,
            session: "s-9".into(),
            kind: Kind::Crash,
            ts: 100.0 + after_seconds,
            after_seconds,
            host: host.map(Into::into),
            file: None,
        }
    }

    #[test]
    fn later_failures_are_named_then_counted() {
        assert_eq!(later_failures(&[], 3), None);
        let fs = [
            later(Some(3), 75.0, None),
            later(None, 3725.0, Some("node-b")),
            later(Some(1), 12.25, None),
            later(Some(2), 90.0, None),
        ];
        assert_eq!(
            later_failures(&fs, 3).as_deref(),
            Some(
                "failed past the cascade window: rank 3 crash +1m, session s-9 crash +1h02m, \
                 rank 1 crash +12.2 s, 1 more"
            )
        );
        assert_eq!(failure_refs(&fs[..1], 0), "1 more");
    }
}
