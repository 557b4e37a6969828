#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

const SNAPSHOT: &str = r#"{"version":"0.1.0","hostname":"n1","ts":1763700000.0,"nvml":{"up":true,"error":null,"library":"x","driver_version":null,"last_poll_ts":null,"last_poll_duration_seconds":0.0},"gpus":[],"processes":[]}"#;

/// A real HTTP server on loopback answering each request with `answer(request head)` (the
/// whole response, head and body), then closing; the request heads it got, in order.
fn serve(answer: impl Fn(&str) -> Vec<u8> + Send + 'static) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            // Logged before answering: the client reads the log as soon as it has the answer.
            let reply = answer(&head);
            log.lock().unwrap().push(head);
            let _ = c.write_all(&reply);
        }
    });
    (base, seen)
}

fn client() -> DaemonClient {
    DaemonClient::plain(Duration::from_secs(30))
}

#[test]
fn an_etag_is_sent_back_and_a_304_is_not_read_again() {
    let (base, seen) = serve(|head| {
        if head.contains("If-None-Match: \"v1\"") || head.contains("if-none-match: \"v1\"") {
            b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        } else {
            format!(
                "HTTP/1.1 200 OK\r\nETag: \"v1\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{SNAPSHOT}",
                SNAPSHOT.len()
            )
            .into_bytes()
        }
    });
    let first = fetch(&client(), &base, 300.0, None, None).unwrap();
    let Fetched::Snapshot(snap, Some(tag)) = first else {
        panic!("no snapshot with its ETag");
    };
    assert_eq!(snap.hostname, "n1");
    assert_eq!(tag, "\"v1\"");
    let again = fetch(&client(), &base, 300.0, None, Some(&tag)).unwrap();
    assert!(matches!(again, Fetched::Unchanged));
    let heads = seen.lock().unwrap();
    assert!(!heads[0].to_ascii_lowercase().contains("if-none-match"));
    assert!(heads[1]
        .to_ascii_lowercase()
        .contains("if-none-match: \"v1\""));
}

#[test]
fn an_answer_over_the_cap_is_refused_by_name_declared_or_not() {
    // Declared: refused from its head, its body never read.
    let (base, _) = serve(|_| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{{",
            MAX_ANSWER + 1
        )
        .into_bytes()
    });
    let Err(e) = fetch(&client(), &base, 300.0, None, None) else {
        panic!("a 64 MiB + 1 answer was taken");
    };
    assert!(e.contains(&format!("{} bytes", MAX_ANSWER + 1)), "{e}");
    assert!(e.contains("64 MiB the TUI reads"), "{e}");
    // Undeclared (the connection's close ends it): read up to the cap, no further.
    let (base, _) = serve(|_| {
        let mut r = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n[".to_vec();
        r.resize(r.len() + MAX_ANSWER as usize + 4096, b' ');
        r
    });
    let Err(e) = fetch(&client(), &base, 300.0, None, None) else {
        panic!("an undeclared answer over the cap was taken");
    };
    assert!(e.contains("over the 64 MiB the TUI reads"), "{e}");
}

#[test]
fn a_costly_refresh_delays_the_next_to_a_quarter_of_a_core() {
    let second = Duration::from_secs(1);
    // Cheap: the refresh as asked, less what the fetch took.
    assert_eq!(
        pace(second, Duration::from_millis(200), 0.01),
        Duration::from_millis(800)
    );
    // 1.5 s of CPU a refresh: one every 6 s.
    assert_eq!(
        pace(second, Duration::from_millis(500), 1.5),
        Duration::from_millis(5500)
    );
    // Never past the cap, whatever the cost.
    assert_eq!(pace(second, Duration::ZERO, 1e9), MAX_PACE);
    assert_eq!(pace(second, Duration::ZERO, f64::NAN), MAX_PACE);
}

#[test]
fn the_process_cpu_is_read_and_grows_with_work() {
    let before = cpu_seconds().unwrap();
    // Busy until the figure moves by 50 ms; a generous deadline, as the machine may be loaded.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut x = 0u64;
    loop {
        for _ in 0..1_000_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        if cpu_seconds().unwrap() >= before + 0.05 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the CPU figure never moved from {before}"
        );
    }
}
