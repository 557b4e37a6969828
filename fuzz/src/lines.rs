//! Target `lines`: the capped line framing (`LineReader`) over an in-memory reader. The first
//! input byte picks the cap (1..=1021 bytes), the second the read size (1..=32 bytes, so lines
//! straddle reads), the rest is the stream. The frames must equal a plain split on `\n`: lines
//! within the cap with a trailing `\r` stripped, longer ones reported by length only, the
//! unterminated tail as `Eof`, and `Eof` again after that.

use std::cell::RefCell;

use gpumon::sources::ingest::lines::{Frame, LineReader};
use tokio::io::BufReader;
use tokio::runtime::{Builder, Runtime};

thread_local! {
    static RT: RefCell<Option<Runtime>> = const { RefCell::new(None) };
}

pub fn check(data: &[u8]) {
    let [a, b, input @ ..] = data else { return };
    let max = usize::from(*a) * 4 + 1;
    let read_size = usize::from(b % 32) + 1;
    let got = RT.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            Builder::new_current_thread()
                .build()
                .expect("current-thread runtime")
        });
        rt.block_on(frames(input, read_size, max))
    });
    assert_eq!(got, expected(input, max), "cap {max}, reads of {read_size}");
}

/// A frame that owns its line, so frames can be collected across reads.
#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Line(Vec<u8>),
    TooLong { len: usize },
    Eof { partial: usize },
}

fn own(f: Frame<'_>) -> Owned {
    match f {
        Frame::Line(l) => Owned::Line(l.to_vec()),
        Frame::TooLong { len } => Owned::TooLong { len },
        Frame::Eof { partial } => Owned::Eof { partial },
    }
}

async fn frames(input: &[u8], read_size: usize, max: usize) -> Vec<Owned> {
    let mut reader = LineReader::new(BufReader::with_capacity(read_size, input), max);
    let mut out = Vec::new();
    loop {
        let f = own(reader.next().await.expect("reading memory cannot fail"));
        let eof = matches!(f, Owned::Eof { .. });
        out.push(f);
        if eof {
            // The reader is reusable after EOF and reports nothing more.
            out.push(own(reader
                .next()
                .await
                .expect("reading memory cannot fail")));
            return out;
        }
    }
}

fn expected(input: &[u8], max: usize) -> Vec<Owned> {
    let mut out = Vec::new();
    let mut rest = input;
    while let Some(i) = rest.iter().position(|&c| c == b'\n') {
        let line = &rest[..i];
        out.push(if line.len() > max {
            Owned::TooLong { len: line.len() }
        } else {
            Owned::Line(line.strip_suffix(b"\r").unwrap_or(line).to_vec())
        });
        rest = &rest[i + 1..];
    }
    out.push(Owned::Eof {
        partial: rest.len(),
    });
    out.push(Owned::Eof { partial: 0 });
    out
}
