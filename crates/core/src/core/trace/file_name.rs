//! A trace's file name, `gpumon-<started>-<session>-<job>[-r<rank>]` then `.p<part>` and `-<n>`
//! (the recorder's, output record/names.rs): the recorder writes it and `gpumon analyze` reads
//! the session id back from it, so the replay names each session as its daemon did.

pub const PREFIX: &str = "gpumon-";
pub const SUFFIX: &str = ".trace.jsonl";

/// `gpumon-<started>-<session>-<job>[-r<rank>]`, the stem every part of a session shares.
pub fn base(started: f64, session: &str, job: Option<&str>, rank: Option<u64>) -> String {
    format!(
        "{PREFIX}{}-{}{}",
        started.max(0.0) as u64,
        sanitize(session),
        tail(job, rank)
    )
}

/// What follows the session in the stem: `-<job>[-r<rank>]`.
fn tail(job: Option<&str>, rank: Option<u64>) -> String {
    let job = sanitize(job.unwrap_or("trainer"));
    let rank = rank.map(|r| format!("-r{r}")).unwrap_or_default();
    format!("-{job}{rank}")
}

/// The session id a trace's file name holds, given the job and rank its hello names: `s-`,
/// a word and `-` digits (`s-mi8dfxmo-17`, a daemon's since ids carry its start), or `s-` and
/// digits (an older daemon's). None for a name the recorder did not give (a file renamed, a
/// fixture), so the replay numbers that session itself.
pub fn session_of(name: &str, job: Option<&str>, rank: Option<u64>) -> Option<String> {
    let name = name.rsplit('/').next()?;
    let rest = name.strip_prefix(PREFIX)?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let rest = rest[digits..].strip_prefix('-').filter(|_| digits > 0)?;
    let after = rest.strip_prefix("s-")?;
    let word = after
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(after.len());
    let long = after[word..]
        .strip_prefix('-')
        .map(|d| d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let tail = tail(job, rank);
    // The longer id first: the job's own name may begin with `-` and digits.
    let lengths = [long.filter(|d| *d > 0).map(|d| word + 1 + d), Some(word)];
    lengths.into_iter().flatten().find_map(|n| {
        let id = &rest[..2 + n];
        let well_formed =
            word > 0 && (n > word || after[..word].bytes().all(|b| b.is_ascii_digit()));
        (well_formed && rest[2 + n..].starts_with(&tail)).then(|| id.to_string())
    })
}

/// Job names and session ids come from clients or restarts: keep file names to a safe alphabet
/// and length.
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    match out.trim_start_matches('.') {
        "" => "trainer".into(),
        s => s.to_string(),
    }
}

#[cfg(test)]
mod tests;
