//! Target `lines`: the capped line framing (`LineReader`) over an in-memory reader. The first
//! input byte picks the cap (1..=1021 bytes), the second the read size (1..=32 bytes, so lines
//! straddle reads), the rest is the stream. The frames must equal a plain split on `\n`: lines
//! within the cap with a trailing `\r` stripped, longer ones reported by length only, the
//! unterminated tail as `Eof`, and `Eof` again after that.

use std::cell::RefCell;

use gpumon::ingest::lines::{Frame, LineReader};
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

async fn frames(input: &[u8], read_size: usize, max: usize) -> Vec<Frame> {
    let mut reader = LineReader::new(BufReader::with_capacity(read_size, input), max);
    let mut out = Vec::new();
    loop {
        let f = reader.next().await.expect("reading memory cannot fail");
        if let Frame::Eof { .. } = f {
            out.push(f);
            // The reader is reusable after EOF and reports nothing more.
            out.push(reader.next().await.expect("reading memory cannot fail"));
            return out;
        }
        out.push(f);
    }
}

fn expected(input: &[u8], max: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut rest = input;
    while let Some(i) = rest.iter().position(|&c| c == b'\n') {
        let line = &rest[..i];
        out.push(if line.len() > max {
            Frame::TooLong { len: line.len() }
        } else {
            Frame::Line(line.strip_suffix(b"\r").unwrap_or(line).to_vec())
        });
        rest = &rest[i + 1..];
    }
    out.push(Frame::Eof {
        partial: rest.len(),
    });
    out.push(Frame::Eof { partial: 0 });
    out
}
