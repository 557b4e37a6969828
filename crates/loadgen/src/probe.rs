//! Push-to-visible latency: a trainer of its own writes a sample with a new step, then asks the
//! API until that step shows. The clock starts before the write and stops when the answer that
//! shows the step has been read, so the figure is what a dashboard polling the API would see
//! (socket, parse, store, HTTP), not an internal timestamp.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::daemon::Api;
use crate::trainer::Trainer;

/// A probe that has not shown up after this long counts as timed out.
const GIVE_UP: Duration = Duration::from_secs(5);

pub struct Latencies {
    pub samples: Vec<Duration>,
    pub timeouts: usize,
    /// The API path polled.
    pub via: String,
}

impl Latencies {
    /// Nearest-rank percentile, `p` in 0..=100.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let mut v = self.samples.clone();
        v.sort_unstable();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v.get(rank.saturating_sub(1)).copied()
    }
}

/// Probes every `interval` until `stop`.
pub fn run(
    t: &mut Trainer,
    api: &Api,
    interval: Duration,
    stop: &AtomicBool,
) -> anyhow::Result<Latencies> {
    let via = route(api, &t.session)?;
    let mut out = Latencies {
        samples: Vec::new(),
        timeouts: 0,
        via: via.clone(),
    };
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let step = t.one()?;
        loop {
            if shown_step(api, &via, &t.session)? >= Some(step) {
                out.samples.push(start.elapsed());
                break;
            }
            if start.elapsed() > GIVE_UP {
                out.timeouts += 1;
                break;
            }
        }
        if let Some(rest) = interval.checked_sub(start.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(out)
}

/// The per-session endpoint when the daemon has it, else the whole snapshot.
fn route(api: &Api, session: &str) -> anyhow::Result<String> {
    let one = format!("/api/v1/sessions/{session}");
    match api.get(&one)?.0 {
        200 => Ok(one),
        404 => Ok("/api/v1/snapshot".into()),
        code => bail!("GET {one} answered {code}"),
    }
}

fn shown_step(api: &Api, via: &str, session: &str) -> anyhow::Result<Option<u64>> {
    let v = api.json(via)?;
    let view = if via.ends_with("/snapshot") {
        v["sessions"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["session"] == session))
            .cloned()
            .unwrap_or_default()
    } else {
        v
    };
    Ok(view["step"].as_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latencies {
            samples: (1..=100).rev().map(Duration::from_millis).collect(),
            timeouts: 0,
            via: String::new(),
        };
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(50)));
        assert_eq!(l.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(l.percentile(100.0), Some(Duration::from_millis(100)));
        let empty = Latencies {
            samples: vec![],
            timeouts: 0,
            via: String::new(),
        };
        assert_eq!(empty.percentile(99.0), None);
    }
}
