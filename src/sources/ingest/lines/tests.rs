use super::*;
use tokio::io::AsyncWriteExt;

#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Line(Vec<u8>),
    TooLong(usize),
    Eof(usize),
}

/// All frames, taken in batches as the server does.
async fn frames(input: Vec<u8>, max: usize) -> Vec<Owned> {
    let (mut w, r) = tokio::io::duplex(64);
    tokio::spawn(async move {
        // Written in small pieces so lines straddle reads.
        for piece in input.chunks(7) {
            w.write_all(piece).await.unwrap();
        }
    });
    let mut reader = LineReader::new(r, max);
    let mut out = Vec::new();
    loop {
        reader.fill().await.unwrap();
        while let Some(f) = reader.next_buffered() {
            let end = matches!(f, Frame::Eof { .. });
            out.push(match f {
                Frame::Line(l) => Owned::Line(l.to_vec()),
                Frame::TooLong { len } => Owned::TooLong(len),
                Frame::Eof { partial } => Owned::Eof(partial),
            });
            if end {
                return out;
            }
        }
    }
}

#[tokio::test]
async fn splits_lines_and_reports_a_half_line_at_eof() {
    let got = frames(b"one\r\ntwo\n\nthree".to_vec(), 100).await;
    assert_eq!(
        got,
        vec![
            Owned::Line(b"one".to_vec()),
            Owned::Line(b"two".to_vec()),
            Owned::Line(vec![]),
            Owned::Eof(5),
        ]
    );
}

#[tokio::test]
async fn long_lines_are_skipped_and_the_next_line_survives() {
    let mut input = vec![b'x'; 10_000];
    input.extend_from_slice(b"\nok\n");
    input.extend(vec![b'y'; 300]);
    let got = frames(input, 100).await;
    assert_eq!(
        got,
        vec![
            Owned::TooLong(10_000),
            Owned::Line(b"ok".to_vec()),
            Owned::Eof(300)
        ]
    );
}

#[tokio::test]
async fn lines_up_to_the_cap_are_kept_even_past_the_read_size() {
    for len in [100, CHUNK + 10, 3 * CHUNK] {
        let mut input = vec![b'a'; len];
        input.extend_from_slice(b"\nb\n");
        let got = frames(input, 3 * CHUNK).await;
        assert_eq!(got[0], Owned::Line(vec![b'a'; len]), "len {len}");
        assert_eq!(got[1], Owned::Line(b"b".to_vec()));
    }
    let mut over = vec![b'a'; 3 * CHUNK + 1];
    over.push(b'\n');
    let got = frames(over, 3 * CHUNK).await;
    assert_eq!(got[0], Owned::TooLong(3 * CHUNK + 1));
}

#[tokio::test]
async fn a_reader_that_fills_its_buffer_is_backlogged_until_it_catches_up() {
    let (mut w, r) = tokio::io::duplex(4096);
    w.write_all(&b"a\n".repeat(100)).await.unwrap();
    // A cap of 100 makes a 101-byte buffer: 200 bytes take two full reads and a short one.
    let mut reader = LineReader::new(r, 100);
    let mut seen = Vec::new();
    while seen.len() < 100 {
        reader.fill().await.unwrap();
        while let Some(Frame::Line(_)) = reader.next_buffered() {
            seen.push(());
        }
        let caught_up = seen.len() == 100;
        assert_eq!(
            reader.backlogged(),
            !caught_up,
            "after {} lines",
            seen.len()
        );
    }
}

#[tokio::test]
async fn what_one_read_brought_is_one_batch() {
    let (mut w, r) = tokio::io::duplex(4096);
    w.write_all(b"a\nbb\r\nc\nhalf").await.unwrap();
    let mut reader = LineReader::new(r, 100);
    reader.fill().await.unwrap();
    let (mut batch, mut ranges) = (Vec::new(), Vec::new());
    while let Some(Frame::Line(l)) = reader.next_buffered() {
        batch.push(l.to_vec());
        ranges.push(reader.last_line());
    }
    assert_eq!(batch, [b"a".to_vec(), b"bb".to_vec(), b"c".to_vec()]);
    // Until the next read, every line of the batch can be looked at again.
    let again: Vec<_> = ranges
        .into_iter()
        .map(|r| reader.bytes(r).to_vec())
        .collect();
    assert_eq!(again, batch);
    w.write_all(b"\n").await.unwrap();
    drop(w);
    assert_eq!(reader.next().await.unwrap(), Frame::Line(b"half"));
    assert_eq!(reader.next().await.unwrap(), Frame::Eof { partial: 0 });
}

/// A burst (the history a trainer sends at connect) reads in 16 KiB pieces; a trainer that
/// then keeps up is read with 4 KiB again, and every line comes through either way.
#[tokio::test]
async fn the_read_buffer_grows_for_a_burst_and_shrinks_once_quiet() {
    let (mut w, r) = tokio::io::duplex(1 << 20);
    let mut reader = LineReader::new(r, 64 * 1024);
    assert_eq!(reader.buf.len(), QUIET);
    let line = format!("{}\n", "s".repeat(500));
    w.write_all(line.repeat(200).as_bytes()).await.unwrap();
    let mut lines = 0;
    while lines < 200 {
        reader.fill().await.unwrap();
        while let Some(Frame::Line(l)) = reader.next_buffered() {
            assert_eq!(l.len(), 500);
            lines += 1;
        }
    }
    assert_eq!(reader.buf.len(), CHUNK);
    for k in 0..QUIET_RUN + 1 {
        w.write_all(line.as_bytes()).await.unwrap();
        assert_eq!(
            reader.next().await.unwrap(),
            Frame::Line(&line.as_bytes()[..500])
        );
        // The burst's own last read may have been short: one quiet read already.
        if k + 2 < QUIET_RUN {
            assert_eq!(reader.buf.len(), CHUNK, "after {k} quiet reads");
        }
    }
    assert_eq!(reader.buf.len(), QUIET);
}
