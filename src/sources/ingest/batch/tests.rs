//! The batched path against the one-line-at-a-time path it replaced: same replies (codes, line
//! numbers, order), same counters, same sessions, for a connection that mixes every kind of
//! line and is read in pieces that split lines and batches anywhere.

use std::cell::RefCell;

use tokio::io::AsyncWriteExt;

use super::*;
use crate::core::apply::Core;
use crate::core::input::Closing;
use crate::core::store::{HistoryLimits, Store};
use crate::core::trainer::{Ending, Peer};
use crate::sources::ingest::drive::{self, close};
use crate::sources::ingest::protocol::MAX_LINE;

const PEER: Peer = Peer {
    pid: 9,
    uid: 1000,
    gid: 1000,
};

fn sample(step: u64) -> String {
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{}}}}}\n",
        1_763_700_000 + step,
        step * 100
    )
}

const HELLO: &str = "{\"type\":\"hello\",\"v\":1,\"pid\":5,\"job\":\"j\"}\n";

/// Every kind of line, good and bad, and half a line at the end.
fn input() -> Vec<u8> {
    let mut s = Vec::new();
    let mut add = |l: &[u8]| s.extend_from_slice(l);
    add(sample(0).as_bytes()); // no_hello
    add(HELLO.as_bytes());
    add(sample(1).as_bytes());
    add(b"{oops\n"); // bad_json
    add(sample(2).as_bytes());
    add(b"{\"type\":\"dance\"}\n"); // unknown_type
    add(HELLO.as_bytes()); // duplicate_hello
    add(&[b'x'; MAX_LINE + 10]); // line_too_long
    add(b"\n\xff\xfe\n\n"); // bad_json twice (not UTF-8, empty)
    add(b"{\"type\":\"sample\",\"ts\":-1}\n"); // bad_field
    add(b"{\"type\":\"event\",\"ts\":1763700003,\"kind\":\"mark\",\"detail\":\"x\"}\n");
    add(sample(3).trim_end().as_bytes());
    add(b"\r\n");
    add(b"{\"type\":\"bye\",\"ts\":1763700004}\n");
    add(sample(4).as_bytes()); // no_hello again: the session ended, the connection did not
    add(HELLO.as_bytes());
    add(sample(5).as_bytes());
    add(b"{\"type\":\"sam"); // cut off by EOF: counted as bad_json, no reply
    s
}

/// What one connection left behind.
#[derive(Debug, PartialEq)]
struct Run {
    replies: Vec<String>,
    lines: u64,
    rejected: Vec<u64>,
    sessions: Vec<SessionSummary>,
}

#[derive(Debug, PartialEq)]
struct SessionSummary {
    id: String,
    steps: Vec<Option<u64>>,
    events: Vec<String>,
    ended: Option<Ending>,
}

fn summary(s: &Store, stats: &IngestStats, replies: Vec<String>) -> Run {
    Run {
        replies,
        lines: stats.lines.load(Ordering::Relaxed),
        rejected: stats
            .rejected
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .collect(),
        sessions: s
            .sessions
            .live()
            .chain(s.sessions.ended())
            .map(|x| SessionSummary {
                id: x.id.clone(),
                steps: x
                    .series
                    .iter()
                    .map(|p| p.value.and_then(|v| v.step))
                    .collect(),
                events: x.events.iter().map(|e| e.kind.to_string()).collect(),
                ended: x.ended.map(|(_, e)| e),
            })
            .collect(),
    }
}

fn setup(input: Vec<u8>) -> (Core, LineReader<tokio::io::DuplexStream>) {
    let store = Core::new(Store::new(
        HistoryLimits { gpu_points: 10 },
        1.0,
        "test".into(),
    ));
    // A small pipe, written in odd-sized pieces: reads split lines and batches anywhere.
    let (mut w, r) = tokio::io::duplex(1000);
    tokio::spawn(async move {
        for piece in input.chunks(333) {
            w.write_all(piece).await.unwrap();
        }
    });
    (store, LineReader::new(r, MAX_LINE))
}

async fn batched(input: Vec<u8>, admit_first: usize) -> Run {
    let (mut store, mut reader) = setup(input);
    let stats = IngestStats::default();
    let mut conn = Conn::new(PEER);
    let mut batch = Batch::default();
    let replies = RefCell::new(Vec::new());
    let mut admitted = 0;
    let mut batches = 0;
    loop {
        reader.fill().await.unwrap();
        batch.take(&mut reader, || {
            admitted += 1;
            admitted <= admit_first
        });
        // As the server does: a batch with parsed lines goes to the core, as one input.
        let lines = batch.prepare(&mut conn, &stats).map(|l| store.lines(l));
        batch.complete(&mut conn, lines);
        batch.finish(&stats, |l| {
            replies
                .borrow_mut()
                .push(String::from_utf8(l.to_vec()).unwrap())
        });
        batches += 1;
        if batch.closing {
            break;
        }
    }
    if admit_first == usize::MAX {
        assert!(batches > 3, "the input should take several batches");
    }
    close(conn, &mut store, Closing::Crash, 1e9);
    summary(store.store(), &stats, replies.into_inner())
}

/// The server loop before batching: one frame, one lock, one outcome at a time.
async fn one_by_one(input: Vec<u8>, admit_first: usize) -> Run {
    let (mut store, mut reader) = setup(input);
    let stats = IngestStats::default();
    let mut conn = Conn::new(PEER);
    let mut replies = Vec::new();
    let mut admitted = 0;
    loop {
        let outcome = match reader.next().await.unwrap() {
            Frame::Eof { partial } => {
                if partial > 0 {
                    stats.reject(Code::BadJson);
                }
                break;
            }
            frame
                if {
                    admitted += 1;
                    admitted > admit_first
                } && !matches!(frame, Frame::Line(l) if protocol::parse(l).is_ok_and(|m| exempt(&m))) =>
            {
                stats.reject(Code::RateLimited);
                match conn.over_limit(now()) {
                    Some(o) => o,
                    None => continue,
                }
            }
            Frame::TooLong { len } => conn.reject(Rejection::new(
                Code::LineTooLong,
                format!("line of {len} bytes exceeds {MAX_LINE}; it was skipped"),
            )),
            Frame::Line(line) => drive::line(&mut conn, line, &mut store, now()),
        };
        match outcome {
            Outcome::Accepted | Outcome::Bye => {
                stats.lines.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Duplicate => {
                stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Reply { line, rejected } => {
                match rejected {
                    // Counted above, as every dropped line is.
                    Some(Code::RateLimited) => {}
                    Some(code) => stats.reject(code),
                    None => {
                        stats.lines.fetch_add(1, Ordering::Relaxed);
                    }
                }
                replies.push(String::from_utf8(line).unwrap());
            }
        }
    }
    close(conn, &mut store, Closing::Crash, 1e9);
    summary(store.store(), &stats, replies)
}

fn codes_and_lines(run: &Run) -> Vec<(String, u64)> {
    run.replies
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(r).unwrap();
            let what = v["code"].as_str().or(v["type"].as_str()).unwrap();
            (what.to_string(), v["line"].as_u64().unwrap_or(0))
        })
        .collect()
}

fn rejected(run: &Run, code: Code) -> u64 {
    run.rejected[Code::ALL.iter().position(|c| *c == code).unwrap()]
}

#[tokio::test]
async fn every_line_gets_the_reply_and_count_it_got_one_at_a_time() {
    let got = batched(input(), usize::MAX).await;
    assert_eq!(got, one_by_one(input(), usize::MAX).await);
    let expect: Vec<(String, u64)> = [
        ("no_hello", 1),
        ("welcome", 0),
        ("bad_json", 4),
        ("unknown_type", 6),
        ("duplicate_hello", 7),
        ("line_too_long", 8),
        ("bad_json", 9),
        ("bad_json", 10),
        ("bad_field", 11),
        ("no_hello", 15),
        ("welcome", 0),
    ]
    .iter()
    .map(|(c, l)| (c.to_string(), *l))
    .collect();
    assert_eq!(codes_and_lines(&got), expect);
    // hello, 3 samples, event, bye, hello, sample.
    assert_eq!(got.lines, 8);
    assert_eq!(
        rejected(&got, Code::BadJson),
        4,
        "three lines and the cut-off one"
    );
    assert_eq!(got.rejected.iter().sum::<u64>(), 10);
    assert_eq!(rejected(&got, Code::NoHello), 2);
    let first = &got.sessions[0];
    assert_eq!(first.id, "s-1");
    assert_eq!(first.steps, [Some(1), Some(2), Some(3)]);
    assert_eq!(first.events, ["mark"]);
    assert_eq!(first.ended, Some(Ending::Clean));
    let second = &got.sessions[1];
    assert_eq!(second.steps, [Some(5)]);
    assert_eq!(second.events, ["crash"], "closed without bye");
    assert_eq!(second.ended, Some(Ending::Crash));
}

/// Frames of `input()` the rate limit never drops (1-based): hello, the second hello, bye, hello.
const EXEMPT: [usize; 4] = [2, 7, 14, 16];
const FRAMES: usize = 17;

#[tokio::test]
async fn lines_over_the_rate_limit_are_dropped_and_counted_and_the_connection_goes_on() {
    for limit in [0, 1, 2, 5, 12, 16] {
        let got = batched(input(), limit).await;
        assert_eq!(got, one_by_one(input(), limit).await, "limit {limit}");
        let dropped = (limit + 1..=FRAMES).filter(|i| !EXEMPT.contains(i)).count();
        assert_eq!(
            rejected(&got, Code::RateLimited),
            dropped as u64,
            "limit {limit}"
        );
        let replies = codes_and_lines(&got);
        // One notice for the lot (the test runs well within a second), at the first dropped line.
        let first = (limit + 1..=FRAMES).find(|i| !EXEMPT.contains(i)).unwrap();
        let limited: Vec<_> = replies
            .iter()
            .filter(|(c, _)| c == "rate_limited")
            .collect();
        assert_eq!(
            limited,
            [&("rate_limited".to_string(), first as u64)],
            "limit {limit}"
        );
        // Exempt lines went through whatever the limit: both sessions opened, the first ended
        // by its bye (clean), and line numbers past the dropped lines are still right.
        assert_eq!(replies.iter().filter(|(c, _)| c == "welcome").count(), 2);
        assert!(replies.contains(&("duplicate_hello".to_string(), 7)));
        assert_eq!(got.sessions.len(), 2);
        assert_eq!(got.sessions[0].ended, Some(Ending::Clean), "limit {limit}");
        assert!(got.sessions[0].steps.len() <= limit, "limit {limit}");
    }
}

#[tokio::test]
async fn an_oom_event_over_the_limit_still_lands() {
    let mut input = HELLO.as_bytes().to_vec();
    input.extend_from_slice(sample(1).as_bytes());
    input.extend_from_slice(
        b"{\"type\":\"event\",\"ts\":1763700003,\"kind\":\"mark\",\"detail\":\"x\"}\n",
    );
    input.extend_from_slice(
        b"{\"type\":\"event\",\"ts\":1763700003,\"kind\":\"oom\",\"alloc_bytes\":1024}\n",
    );
    let got = batched(input, 1).await;
    assert_eq!(got.sessions[0].events, ["oom", "crash"]);
    assert_eq!(rejected(&got, Code::RateLimited), 2);
}

/// The hour of history a trainer sends at connect grows a batch to 256 lines; a trainer then
/// sending a line a second, or 16 lines a read, keeps that memory only until a run of batches
/// has shown it needs far less.
#[test]
fn a_connection_past_its_burst_gives_back_what_it_grew() {
    let mut b = Batch::default();
    let batch = |b: &mut Batch, lines: usize, bytes: usize| {
        b.items.extend((0..lines).map(|_| Item::Limited));
        b.raw.extend(std::iter::repeat_n(b'x', bytes));
        b.note_size();
        b.items.clear();
        b.raw.clear();
    };
    let burst = |b: &mut Batch| batch(b, MAX_LINES, 150_000);
    burst(&mut b);
    for _ in 0..RUN - 1 {
        batch(&mut b, 1, 300);
    }
    // Not yet: the run held the burst, and a connection with bursts in every run keeps them.
    assert!(b.items.capacity() >= MAX_LINES && b.raw.capacity() >= 150_000);
    for _ in 0..RUN {
        batch(&mut b, 1, 300);
    }
    assert!(b.items.capacity() <= 2 * SMALL, "{}", b.items.capacity());
    assert!(b.raw.capacity() <= SMALL * 1024, "{}", b.raw.capacity());
    // A busy trainer: 16 lines a read keep room for 16, not for the burst.
    burst(&mut b);
    for _ in 0..2 * RUN {
        batch(&mut b, 16, 8_000);
    }
    assert!(
        (16..=32).contains(&b.items.capacity()),
        "{}",
        b.items.capacity()
    );
    assert!(b.raw.capacity() <= 16_000, "{}", b.raw.capacity());
}

/// Without a recorder the lines' bytes are not copied: what is parsed is all the batch keeps.
#[tokio::test]
async fn lines_are_copied_only_for_a_recorded_session() {
    let input = [HELLO.as_bytes(), sample(1).as_bytes()].concat();
    for keep in [false, true] {
        let (_, mut reader) = setup(input.clone());
        let mut b = Batch::default().keeping_raw(keep);
        while b.items.len() < 2 {
            reader.fill().await.unwrap();
            b.take(&mut reader, || true);
        }
        let expected = if keep { input.len() - 2 } else { 0 };
        assert_eq!(b.raw.len(), expected);
    }
}
