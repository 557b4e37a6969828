//! The golden protocol fixtures, shared with the Python client: every line the client emits is
//! accepted by the daemon's parser and state machine, and every reply the client is tested
//! against is a reply this daemon can produce.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use gpumon::core::apply::Core;
use gpumon::core::input::{Input, Lines};
use gpumon::core::store::sessions::{SessionLimits, Sessions};
use gpumon::core::trainer::Peer;
use gpumon::sources::ingest::conn::{Conn, Outcome};
use gpumon::sources::ingest::protocol::{self, Code, Reply};

/// One line through the connection and the core as ingest takes it: parsed, numbered (`take`),
/// applied by the core as a batch, and its outcome made (`applied`).
fn take_line(conn: &mut Conn, raw: &[u8], core: &mut Core, now: f64) -> Outcome {
    let (msg, seq) = match protocol::parse_numbered(raw) {
        Ok(m) => m,
        Err(r) => return conn.reject(r),
    };
    let mut batch = Box::new(Lines::new(conn.link()));
    let pending = match conn.take(msg, seq, &mut batch.messages) {
        Ok(p) => p,
        Err(o) => return o,
    };
    batch.now = now;
    let mut done = core
        .apply(Input::Lines(batch))
        .into_lines()
        .expect("lines in, lines out");
    conn.moved_on(done.link);
    let applied = done.applied.pop().expect("one answer per message");
    conn.applied(applied, pending, raw, now)
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/protocol")
}

#[test]
fn every_client_fixture_line_is_accepted() {
    let mut files = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.starts_with("client_") && name.ends_with(".jsonl")) {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let mut sessions = Core::with_sessions(Sessions::new(SessionLimits::default()));
        let mut conn = Conn::new(Peer {
            pid: 1,
            uid: 0,
            gid: 0,
        });
        let mut byes = 0;
        for (i, line) in text.lines().enumerate() {
            let msg = protocol::parse(line.as_bytes())
                .unwrap_or_else(|e| panic!("{name}:{}: {e}", i + 1));
            // An answer is taken only for the request it answers, which the daemon makes on a
            // leak or a likely OOM that these few lines do not hold: it must reach the state
            // machine as an answer (refused by that rule alone). Answers taken for their
            // requests: src/core/tests/attribute.rs and arm.rs, and the recorded traces
            // `gpumon analyze` replays (tests/analyze_cli.rs).
            let answer = matches!(
                msg,
                protocol::Message::Attribution(_)
                    | protocol::Message::Armed(_)
                    | protocol::Message::Peak(_)
            );
            match take_line(&mut conn, line.as_bytes(), &mut sessions, 1.0) {
                Outcome::Accepted if !answer => {}
                Outcome::Bye => byes += 1,
                Outcome::Duplicate => panic!("{name}:{}: a replay drops no line", i + 1),
                Outcome::Reply {
                    line: reply,
                    rejected: Some(Code::BadField),
                } if answer => {
                    let reply = String::from_utf8_lossy(&reply);
                    assert!(
                        reply.contains("answers no open"),
                        "{name}:{}: {reply}",
                        i + 1
                    );
                }
                Outcome::Reply {
                    line: reply,
                    rejected,
                } => {
                    assert_eq!(
                        rejected,
                        None,
                        "{name}:{}: {}",
                        i + 1,
                        String::from_utf8_lossy(&reply)
                    );
                    assert!(i == 0, "only the hello gets a reply");
                }
                other => panic!("{name}:{}: {other:?}", i + 1),
            }
        }
        assert!(byes <= 1, "{name}");
    }
    assert!(
        files >= 2,
        "expected the client's fixtures in {:?}",
        fixtures()
    );
}

#[test]
fn the_categories_fixture_is_the_split_the_client_measured() {
    let text = std::fs::read_to_string(fixtures().join("client_categories.jsonl")).unwrap();
    let splits: Vec<_> = text
        .lines()
        .filter_map(|line| match protocol::parse(line.as_bytes()).unwrap() {
            protocol::Message::Sample(s) => s.categories,
            _ => None,
        })
        .collect();
    assert_eq!(splits.len(), 1, "one measured step");
    let c = &splits[0];
    const GIB: u64 = 1 << 30;
    assert_eq!(
        (c.step, c.parameters_bytes, c.gradients_bytes),
        (3, 2 * GIB, 4 * GIB)
    );
    assert_eq!(c.optimizer_state_bytes, 8 * GIB);
    assert_eq!(c.buffers_bytes + c.activations_bytes, 6 * GIB);
    assert_eq!(c.batch_size, Some(16));
    // Of the parameters and gradients, the float32 part: the fp32 main_grad.
    assert_eq!(c.fp32_bytes, Some(4 * GIB));
    assert_eq!(c.partial.len(), 1);
    assert!(c.partial[0].starts_with("main_grad: "), "{:?}", c.partial);
}

#[test]
fn the_reply_fixtures_match_what_the_daemon_sends() {
    let text = std::fs::read_to_string(fixtures().join("replies/daemon.jsonl")).unwrap();
    let mut codes = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        // Re-encode the same content with the daemon's own Reply type: same keys, same order.
        let ours = match v["type"].as_str().unwrap() {
            "welcome" => Reply::Welcome {
                v: v["v"].as_u64().unwrap(),
                server: v["server"].as_str().unwrap(),
                session: v["session"].as_str().unwrap(),
                max_lines_per_second: v["max_lines_per_second"].as_u64().map(|n| n as u32),
                ack: v["ack"].as_bool().unwrap_or(false),
            }
            .to_line(),
            "ack" => Reply::Ack {
                seq: v["seq"].as_u64().unwrap(),
            }
            .to_line(),
            "error" => {
                let code = Code::ALL
                    .into_iter()
                    .find(|c| c.as_str() == v["code"].as_str().unwrap())
                    .unwrap_or_else(|| panic!("daemon has no code {}", v["code"]));
                codes.push(code);
                Reply::Error {
                    code,
                    line: v["line"].as_u64().unwrap(),
                    message: v["message"].as_str().unwrap(),
                }
                .to_line()
            }
            "attribute" => Reply::Attribute {
                v: v["v"].as_u64().unwrap(),
                id: v["id"].as_u64().unwrap(),
                finding: v["finding"].as_str().unwrap(),
                steps: v["steps"].as_u64().unwrap(),
                seconds: v["seconds"].as_f64().unwrap(),
                max_entries: v["max_entries"].as_u64().unwrap(),
                top: v["top"].as_u64().unwrap(),
            }
            .to_line(),
            other => panic!("unexpected reply type {other}"),
        };
        assert_eq!(String::from_utf8(ours).unwrap().trim_end(), line);
    }
    for code in [
        "bad_json",
        "line_too_long",
        "no_hello",
        "unsupported_version",
        "unknown_type",
        "bad_field",
        "rate_limited",
    ] {
        assert!(
            codes.iter().any(|c| c.as_str() == code),
            "fixture lacks {code}"
        );
    }
}

/// The client's SIGTERM line, replayed by `gpumon analyze` as a trace that ends without bye: a
/// stop naming the signal, not a crash; and a stop alone is no finding to exit 1 for.
#[test]
fn the_stopped_fixture_replays_as_a_stop_not_a_crash() {
    let path = fixtures().join("client_stopped.jsonl");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumon"))
        .args(["analyze", "--format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings: Vec<&serde_json::Value> = report["traces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let kinds: Vec<&str> = findings
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["stopped"], "{report:#}");
    assert_eq!(report["jobs"][0]["state"], "stopped", "{report:#}");
    assert_eq!(report["jobs"][0]["stop"]["signal"], "SIGTERM");
    assert_eq!(findings[0]["evidence"]["signal"], "SIGTERM");
}
