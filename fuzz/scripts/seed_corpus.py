#!/usr/bin/env python3
"""Writes the starting corpus of each fuzz target into fuzz/corpus/<target>/: the protocol
fixtures' lines and hand-written hostile lines. Run once before the first fuzzing session;
later sessions start from the minimised corpus kept in git."""

import hashlib
from pathlib import Path

FUZZ = Path(__file__).resolve().parent.parent
FIXTURES = FUZZ.parent / "tests/fixtures/protocol"

HELLO = b'{"type":"hello","v":1,"pid":5,"job":"j","gpu_uuid":"GPU-1"}'
SAMPLE = b'{"type":"sample","ts":1763700000,"step":1,"stats":{"allocated_bytes.all.current":10,"num_ooms":0}}'
EVENT = b'{"type":"event","ts":1763700001,"kind":"mark","detail":"x"}'
BYE = b'{"type":"bye","ts":1763700002}'


def sample_with(field: bytes) -> bytes:
    return b'{"type":"sample","ts":1763700000,' + field + b"}"


HOSTILE = [
    b"",
    b" ",
    b"null",
    b"{}",
    b"[]",
    b"[1,2]",
    b'"hello"',
    b"1",
    b"{oops",
    b'{"type":"sam',
    b"\xff\xfe",
    b'{"type":"hello","v":1,"job":"\xc3"}',
    b'{"type":"hello","v":1,"job":"\\ud800"}',
    b'{"type":"hello","v":1,"job":"a\\u0000b\\n\\"c"}',
    b'{"type":"hello","v":1,"job":"' + "ü✓🚀".encode() + b'"}',
    b'{"type":"hello","v":1,"job":"' + b"j" * 128 + b'"}',
    b'{"type":"hello","v":1,"job":"' + b"j" * 129 + b'"}',
    b'{"type":"hello","v":2}',
    b'{"type":"hello","v":0}',
    b'{"type":"hello","v":"1"}',
    b'{"type":"hello","v":1.0}',
    b'{"type":"hello"}',
    b'{"type":"hello","type":"bye","v":1}',
    b'{"type":"hello","v":1,"rank":-1,"expandable_segments":"no"}',
    b'{"type":"Hello","v":1}',
    b'{"type":"dance"}',
    b'{"type":1}',
    b'{"type":null}',
    b'{"ts":1763700000}',
    b'{"type":"sample"}',
    b'{"type":"sample","ts":"now"}',
    b'{"type":"sample","ts":NaN}',
    b'{"type":"sample","ts":Infinity}',
    b'{"type":"sample","ts":-1}',
    b'{"type":"sample","ts":1e400}',
    b'{"type":"sample","ts":946684800}',
    b'{"type":"sample","ts":946684799.999}',
    b'{"type":"sample","ts":4102444800}',
    b'{"type":"sample","ts":4102444799.999999}',
    sample_with(b'"step":-1'),
    sample_with(b'"step":1.5'),
    sample_with(b'"step":18446744073709551616'),
    sample_with(b'"device_free":1125899906842624'),
    sample_with(b'"device_free":1125899906842625'),
    sample_with(b'"device_total":1e30'),
    sample_with(b'"phase":"eval"'),
    sample_with(b'"phase":5'),
    sample_with(b'"stats":[]'),
    sample_with(b'"stats":null'),
    sample_with(b'"stats":{"num_ooms":-1}'),
    sample_with(b'"stats":{"num_ooms":1.5}'),
    sample_with(b'"stats":{"num_ooms":"x"}'),
    sample_with(b'"stats":{"num_ooms":[1]}'),
    sample_with(b'"stats":{"num_ooms":null,"segment.all.current":{"a":[1,{}]}}'),
    sample_with(b'"stats":{"num_ooms":1,"num_ooms":2}'),
    sample_with(b'"stats":{"num_\\u006fom\\u0073":3}'),
    sample_with(b'"future":' + b"[" * 40 + b"]" * 40),
    b"[" * 200,
    b'{"a":' * 150 + b"1" + b"}" * 150,
    b'{"type":"event","ts":1763700000}',
    b'{"type":"event","ts":1763700000,"kind":"oom","alloc_bytes":2147483648,"device_free":1}',
    b'{"type":"event","ts":1763700000,"kind":"snapshot","path":"/x/y.pickle"}',
    b'{"type":"event","ts":1763700000,"kind":"mark","detail":"' + b"d" * 4097 + b'"}',
    b'{"type":"bye"}',
    b'{"type":"bye","ts":"later"}',
    HELLO,
    SAMPLE,
    EVENT,
    BYE,
]

CONN = [
    [SAMPLE, HELLO, HELLO, SAMPLE, BYE, SAMPLE, HELLO, SAMPLE],
    [HELLO] + [SAMPLE] * 10 + [EVENT] * 6 + [BYE],
    [HELLO, b"\x00c", HELLO, b"\x00\x01", HELLO, SAMPLE, b"\x00\x02", HELLO, b"\x00c", b"\x00\x01", b"\x00c"],
    [HELLO, b"{oops", b"\xff", b'{"type":"hello","v":2}', b'{"type":"dance"}', SAMPLE, EVENT],
    [HELLO, b"\x00c"] * 5,
    [b'{"type":"hello","v":1}', SAMPLE.replace(b"1763700000", b"-5"), SAMPLE, BYE, BYE],
]

LINES = [
    b"one\r\ntwo\n\nthree",
    b"\n",
    b"",
    b"\r\n\r\r\n\r",
    b"x" * 4 + b"\n" + b"y" * 5 + b"\nok\n" + b"z" * 9,
    b"a" * 40 + b"\n" + b"b" * 41 + b"\r\n",
]


def write(target: str, data: bytes) -> None:
    d = FUZZ / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main() -> None:
    fixtures = sorted(FIXTURES.glob("client_*.jsonl"))
    for f in fixtures:
        text = f.read_bytes()
        for line in text.splitlines():
            write("parse", line)
        write("conn", text)
        for a, b in [(0, 0), (9, 7), (255, 31)]:
            write("lines", bytes([a, b]) + text)
    for line in HOSTILE:
        write("parse", line)
    for seq in CONN:
        write("conn", b"\n".join(seq))
    for i, stream in enumerate(LINES):
        write("lines", bytes([9, i * 5]) + stream)
        write("lines", bytes([1, 31]) + stream)


if __name__ == "__main__":
    main()
