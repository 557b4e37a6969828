"""The streaming reader: the same data as pickle on every fixture, only what a schema keeps, code
refused where it stands (opcode and offset named), and hostile streams of 2 GB (bombs, deep
nesting, code at the end) refused with memory that does not grow with the file."""

import ast
import functools
import io
import os
import pickle
import struct
import resource
import subprocess
import sys

import pytest

from gpumon_client.snapshot import explain as ex_mod
from gpumon_client.snapshot import diff as snapdiff
from gpumon_client.snapshot import load as snapload
from gpumon_client.snapshot import pickleread
from gpumon_client.snapshot.pickleread import Limits, ReadError, read
from gpumon_client.snapshot.pickleschema import DROP, FRAMES, KEEP, Schema

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures"))
FIXTURES = sorted(os.path.join(ROOT, d, f) for d in ("torch-snapshots", "torch-oom")
                  for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".pickle"))
GIB = 1 << 30


@functools.lru_cache(maxsize=None)
def raw(path):
    with open(path, "rb") as f:
        return f.read()


def reads(data, schema=snapload.ALL, **limits):
    return read(io.BytesIO(data), schema, Limits(**limits))[0]


def refused(data, schema=snapload.ALL, **limits):
    with pytest.raises(ReadError) as err:
        read(io.BytesIO(data) if isinstance(data, bytes) else data, schema, Limits(**limits))
    return err.value


# --- the same data --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_every_fixture_reads_as_pickle_reads_it_from_both_picklers(path):
    data = raw(path)
    ref = pickle.loads(data)
    assert reads(data) == ref
    # The pure-Python pickler batches otherwise (a single APPEND/SETITEM for a remainder of one).
    for proto in (2, 3, 4, 5):
        assert reads(pickle._dumps(ref, protocol=proto)) == ref
        assert reads(pickle.dumps(ref, protocol=proto)) == ref


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_what_explain_and_diff_keep_gives_their_answers(path):
    full = pickle.loads(raw(path))
    kept = snapload.loads(raw(path), keep="explain", check=False)
    assert ex_mod.explain(kept).as_json() == ex_mod.explain(full).as_json()
    for e in kept["device_traces"][0]:
        assert set(e) <= {"action", "addr", "size", "time_us", "device_free", "frames"}
    small = snapload.loads(raw(path), keep="diff")
    assert set(small) == {"segments"}
    a, b = snapdiff.diff(small, small), snapdiff.diff(full, full)
    assert a == b and snapdiff._tally(small)[2] == snapdiff._tally(full)[2]


def test_frames_lists_are_interned_once_per_stack():
    data = raw(os.path.join(ROOT, "torch-oom", "leak.pickle"))
    snap = reads(data)
    lists = [e["frames"] for e in snap["device_traces"][0]] + [b["frames"] for s in snap["segments"] for b in s["blocks"]]
    distinct = {tuple(map(id, f)) for f in lists}
    assert len({id(f) for f in lists}) == len(distinct) < 20 < len(lists)


def test_plain_data_of_every_kind():
    values = [None, True, False, 0, 255, 65535, -1, 1 << 31, -(1 << 70), 1.5, "", "é" * 300, b"x" * 300,
              bytearray(b"y"), (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [1] * 1001, {"k": 1}, {i: i for i in range(1001)},
              {1, 2}, frozenset([3])]
    for v in values:
        # Before protocol 4 (sets) and 5 (bytearray) pickle writes these as calls, refused.
        for proto in (5,) if type(v) is bytearray else (4, 5) if type(v) in (set, frozenset) else (3, 4, 5):
            got = reads(pickle.dumps({"x": v}, protocol=proto))["x"]
            assert got == v and type(got) is type(v), (v, proto)


# --- what runs code, where it stands ----------------------------------------------------------------


CASES = {
    "GLOBAL": (b"\x80\x02cos\nsystem\n", "the pickle asks for os.system (GLOBAL at offset 2)"),
    "STACK_GLOBAL": (b"\x80\x04\x8c\x02os\x8c\x06system\x93", "the pickle asks for os.system (STACK_GLOBAL at offset 14)"),
    "INST": (b"\x80\x02(ios\nsystem\n", "the pickle asks for os.system (INST at offset 3)"),
    "OBJ": (b"\x80\x02(K\x01o", "the pickle asks to create an object (OBJ at offset 5)"),
    "REDUCE": (b"\x80\x02K\x01)R", "the pickle asks to call something (REDUCE at offset 5)"),
    "BUILD": (b"\x80\x02}}b", "the pickle asks to set an object's state (BUILD at offset 4)"),
    "NEWOBJ": (b"\x80\x02K\x01)\x81", "the pickle asks to create an object (NEWOBJ at offset 5)"),
    "NEWOBJ_EX": (b"\x80\x04K\x01)}\x92", "the pickle asks to create an object (NEWOBJ_EX at offset 6)"),
    "EXT1": (b"\x80\x02\x82\x07", "(EXT1 at offset 2)"),
    "EXT2": (b"\x80\x02\x83\x07\x00", "(EXT2 at offset 2)"),
    "EXT4": (b"\x80\x02\x84\x07\x00\x00\x00", "(EXT4 at offset 2)"),
    "PERSID": (b"\x80\x02Pid\n", "the pickle asks for a persistent id (PERSID at offset 2)"),
    "BINPERSID": (b"\x80\x02K\x01Q", "the pickle asks for a persistent id (BINPERSID at offset 4)"),
    "NEXT_BUFFER": (b"\x80\x05\x97", "the pickle asks for an out-of-band buffer (NEXT_BUFFER at offset 2)"),
    "READONLY_BUFFER": (b"\x80\x05\x98", "the pickle asks for an out-of-band buffer (READONLY_BUFFER at offset 2)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_opcode_that_runs_code_is_refused_naming_it_and_its_offset(name):
    data, why = CASES[name]
    err = refused(data + b".")
    assert err.what == "refused" and why in err.why, err.why
    msg = str(snapload.SnapshotError("f.pickle", snapload._why(err, len(data), 1)))
    assert msg.startswith("f.pickle: refused: ") and "(nothing was run)" in msg


def test_broken_streams_say_truncated_or_not_a_pickle():
    data = pickle.dumps({"segments": [{"blocks": [], "frames": []}], "s": "x" * 400, "n": 1 << 80}, protocol=4)
    for n in range(len(data) - 1):  # every prefix
        err = refused(data[:n])
        assert err.what == "truncated" or (n == 0 and err.why == "empty"), (n, err)
    for bad, why in ((b"\x80\x09N.", "protocol 9"), (b"\xff", "unknown opcode 0xff"), (b"s", "SETITEM at offset 0"),
                     (b"I1\n.", "protocol 0 text opcode"), (b"\x80\x04h\x05.", "BINGET at offset 2")):
        err = refused(bad)
        assert err.what == "malformed" and why in err.why, (bad, err.why)


# --- sharing, cycles, layout --------------------------------------------------------------------------


def test_structural_places_cannot_be_shared_through_the_memo():
    seg = {"blocks": [{"state": "active_allocated", "size": 1, "frames": []}]}
    data = pickle.dumps({"segments": [seg] * 1000})  # a billion laughs, one level of it
    assert "may not be shared" in refused(data).why
    blocks = [{"state": "active_allocated", "size": 1}] * 3
    assert "may not be shared" in refused(pickle.dumps({"segments": [{"blocks": blocks}]})).why
    # Where plain data is kept, sharing costs a reference: the laughs read in bounded memory.
    laughs = ["ha"]
    for _ in range(6):
        laughs = [laughs] * 100  # 10^12 strings, read as 600 references
    assert reads(pickle.dumps({"segments": [], "other": laughs}), budget=1 << 20)["other"][0][0][0][0][0][0] == ["ha"]


def test_a_container_cannot_contain_itself():
    a = []
    a.append(a)
    assert "after referring to it" in refused(pickle.dumps({"x": a})).why
    d = {}
    d["me"] = [d]
    err = refused(pickle.dumps({"x": d}))
    assert err.what == "refused" and "fills a container" in err.why


def test_a_schema_keeps_only_what_it_names():
    spec = Schema({"keep": KEEP, "frames": FRAMES, "drop": DROP, "*": DROP})
    data = pickle.dumps({"keep": [1, {"a": 2}], "drop": {"big": ["x" * 300] * 10}, "other": [3], "frames": []})
    assert reads(data, spec) == {"keep": [1, {"a": 2}], "frames": []}


# --- hostile streams of 2 GB ---------------------------------------------------------------------------


class Stream(io.RawIOBase):
    """`head`, then `body` repeated up to `size` bytes, then `tail`, made as it is read."""

    def __init__(self, head, body, size, tail=b""):
        self.head, self.tail, self.left = head, tail, size
        self.unit = len(body)
        self.body = body * (2 + (256 << 10) // len(body))
        self.off = 0  # where in `body` the next byte is

    def readable(self):
        return True

    def read(self, n=-1):
        out, self.head = self.head[:n], self.head[n:]
        k = min(n - len(out), self.left, len(self.body) - self.unit)
        if k > 0:
            out += self.body[self.off: self.off + k]
            self.off = (self.off + k) % self.unit
            self.left -= k
        if len(out) < n and self.left == 0:
            out, self.tail = out + self.tail[: n - len(out)], self.tail[n - len(out):]
        return out


BOMB = """
import resource, sys
sys.path[:0] = [%r, %r]
from test_pickleread import GIB, Limits, ReadError, Stream, read, snapload
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read(Stream(*%r), snapload.ALL, Limits(**%r))
except ReadError as err:
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(repr((err.what, err.why, err.offset, grown >> 10)))
"""


def bomb(head, body, limit_mib, tail=b"", **limits):
    """(what, why, offset) of reading `head` + `body` repeated to 2 GB + `tail`, in a process of
    its own whose peak memory must not grow by more than limit_mib while it reads."""
    code = BOMB % (HERE, os.path.dirname(HERE), (head, body, 2 * GIB, tail), limits)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout, out.stderr
    what, why, offset, grown = ast.literal_eval(out.stdout.strip())
    assert grown < limit_mib, "grew %d MiB" % grown
    return what, why, offset


def test_hostile_2gb_streams_are_refused_in_bounded_memory():
    proto = b"\x80\x04"
    # Deep nesting: marks, and plain data built one level at a time through the memo
    # ([[[...]]]: a new list holds memo 0, becomes memo 0, is popped; and again).
    assert bomb(proto, b"(", 8) == ("limit", "marks nested deeper than 100 (MARK at offset 102)", 102)
    what, why, offset = bomb(proto + b"]q\x000", b"]h\x00aq\x000", 8)
    assert what == "limit" and "plain data nested deeper than 100" in why and offset < 2000
    # DUP and memo bombs: one item repeated, the stack or the memo grows, not the file read.
    # (Limits lowered from their defaults so that the test is quick; the rule is the same.)
    what, why, offset = bomb(proto + b"K\x01", b"2", 16, stack=1 << 14)
    assert what == "limit" and "items on the stack" in why and offset < 1 << 20
    what, why, offset = bomb(proto + b"K\x01", b"\x94", 16, budget=4 << 20)
    assert what == "budget" and 0 < offset < 2 << 20
    # Strings, each new and memoized: the budget, long before the end.
    what, why, offset = bomb(proto + b"]\x94", b"(" + b"\x8c\x08abcdefgh\x94" * 500 + b"e", 24, budget=8 << 20)
    assert what == "budget" and offset < 4 << 20
    # A list longer than a list may be.
    what, why, offset = bomb(proto + b"]\x94", b"(" + b"K\x01" * 1000 + b"e", 24, items=1 << 16)
    assert what == "limit" and "a list of more than 65536 items" in why


def test_code_after_2gb_of_data_is_refused_where_it_stands_in_bounded_memory():
    # 2 GB in one string that the schema drops, streamed past; then a call.
    spec = Schema({"pad": DROP, "*": DROP})
    size = 2 * GIB
    head = b"\x80\x04}\x94\x8c\x03pad\x8d" + struct.pack("<Q", size)
    tail = b"\x8c\x02os\x8c\x06system\x93"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ReadError) as err:
        read(Stream(head, b"x", size, tail), spec)
    assert err.value.what == "refused" and "os.system (STACK_GLOBAL at offset %d)" % (len(head) + size + 12) in err.value.why
    # Well under the file: what the process had at its peak before, or a few MiB more.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 16 << 10
