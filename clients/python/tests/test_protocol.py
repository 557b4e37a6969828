import json
import os

import pytest

from gpumon_client import protocol
from gpumon_client.transport import DEFAULT_SOCKET, socket_candidates

REPLIES = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "tests", "fixtures", "protocol", "replies", "daemon.jsonl"
)


def test_encode_is_one_compact_line():
    line = protocol.encode(protocol.sample(1.5, {"num_ooms": 0}, step=3))
    assert line == b'{"type":"sample","ts":1.5,"step":3,"phase":"train","stats":{"num_ooms":0}}\n'


def test_hello_leaves_out_unknown_fields():
    msg = protocol.hello(pid=7)
    assert msg == {"type": "hello", "v": 1, "pid": 7, "client": protocol.CLIENT}


def test_nan_and_odd_values_do_not_lose_the_line():
    line = protocol.encode(protocol.sample(1.0, {"a": float("nan"), "b": 1}, step=1))
    msg = json.loads(line)
    assert msg["stats"] == {"a": None, "b": 1}
    assert json.loads(protocol.encode({"type": "event", "ts": 1.0, "kind": "mark", "detail": object()}))["detail"]


def test_lines_never_exceed_the_limit():
    huge = {"k%05d.all.current" % i: i for i in range(5000)}
    huge["num_ooms"] = 2
    line = protocol.encode(protocol.sample(1.0, huge, step=1))
    assert len(line) <= protocol.MAX_LINE
    assert json.loads(line)["stats"] == {"num_ooms": 2}  # fell back to the known keys
    line = protocol.encode(protocol.mark_event(1.0, "x" * 100000))
    assert len(line) <= protocol.MAX_LINE and line.endswith(b"\n")


def test_non_ascii_is_utf8():
    line = protocol.encode(protocol.hello(pid=1, job="café"))
    assert "café".encode() in line


@pytest.mark.parametrize(
    "given",
    [
        "101112131415161718191a1b1c1d1e1f",
        "10111213-1415-1617-1819-1a1b1c1d1e1f",
        "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f",
        "GPU-10111213-1415-1617-1819-1A1B1C1D1E1F",
    ],
)
def test_uuid_formatted_like_nvml(given):
    assert protocol.format_gpu_uuid(given) == "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"


def test_uuid_from_raw_bytes_and_odd_forms():
    class U:
        bytes = bytes(range(16))

    assert protocol.format_gpu_uuid(U()) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert protocol.format_gpu_uuid("MIG-abc") == "MIG-abc"
    assert protocol.format_gpu_uuid(None) is None
    assert protocol.format_gpu_uuid("not-a-uuid") == "not-a-uuid"


def test_daemon_replies_fixture_parses():
    with open(REPLIES, "rb") as f:
        replies = [protocol.parse_reply(line) for line in f.read().splitlines()]
    assert replies[0].type == "welcome" and replies[0].session and replies[0].v == 1
    codes = {r.code for r in replies if r.type == "error"}
    assert codes == set(protocol.ERROR_CODES)
    assert all(r.message for r in replies if r.type == "error")


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1]", b'{"type":3}', b"\xff\xfe"])
def test_bad_replies_are_ignored(raw):
    assert protocol.parse_reply(raw) is None


def test_socket_path_order():
    assert socket_candidates({}) == [DEFAULT_SOCKET]
    assert socket_candidates({"XDG_RUNTIME_DIR": "/run/user/1000"}) == [
        "/run/gpumon/ingest.sock",
        "/run/user/1000/gpumon/ingest.sock",
    ]
    env = {"GPUMON_SOCKET": "/srv/g.sock", "XDG_RUNTIME_DIR": "/run/user/1000"}
    assert socket_candidates(env) == ["/srv/g.sock"]
