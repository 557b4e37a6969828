"""`explain --write-trimmed`: a protocol-4 snapshot of what the explanation needs, in opcodes
memory_viz's page reads, whose segments are the device's and whose history holds the OOM, what
followed it and the allocation of every block alive at it (torch's own loader: tests_torch)."""

import functools
import json
import os
import pickle
import pickletools
import subprocess
import sys

import pytest

from gpumon_client.snapshot import trim as snaptrim
from gpumon_client.snapshot.explain import explain
from gpumon_client.snapshot.render import trimmed_text
from gpumon_client.snapshot.state import entries, segments, undo_after
from gpumon_client.snapshot.units import fmt_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-oom"))
CASES = ("pressure", "fragmentation", "leak")

# The opcodes the unpickler of torch/utils/viz/MemoryViz.js handles (protocol 2 to 4 only).
MEMORY_VIZ_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET",
    "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2", "APPEND", "NEWFALSE", "BINPUT",
    "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST",
    "DICT", "SETITEM",
}


@functools.lru_cache(maxsize=None)
def original(case):
    with open(os.path.join(FIXTURES, case + ".pickle"), "rb") as f:
        return pickle.load(f)  # the repository's fixtures


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "gpumon_client", "explain", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", CASES)
def test_the_trimmed_file_holds_what_the_explanation_needs(tmp_path, case):
    out = tmp_path / (case + ".trimmed.pickle")
    r = run_cli(os.path.join(FIXTURES, case + ".pickle"), "--write-trimmed", str(out), "--window", "50")
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    line = r.stdout.splitlines()[-1]
    assert line.startswith("trimmed snapshot: %s, " % out) and "https://pytorch.org/memory_viz" in line
    # Protocol 4, in opcodes memory_viz's page reads.
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert data[:2] == b"\x80\x04" and set(ops) <= MEMORY_VIZ_OPCODES, set(ops) - MEMORY_VIZ_OPCODES
    full, trimmed = original(case), pickle.loads(data)
    # The device's segments, whole: each one's blocks add up to it.
    dev, trace = entries(full, None)
    assert trimmed["segments"] == [s for s in full["segments"] if s["device"] == dev]
    for seg in trimmed["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    # The history: in order, a subsequence; the OOM and all after it; every live block's alloc.
    kept = trimmed["device_traces"][dev]
    assert len(trimmed["device_traces"]) == len(full["device_traces"])
    it = iter(trace)
    assert all(any(e is f or e == f for f in it) for e in kept)
    oom = max(i for i, e in enumerate(trace) if e["action"] == "oom")
    assert kept[-(len(trace) - oom):] == trace[oom:]
    st = segments(full, dev)
    undo_after(st, trace, oom)
    last = {e["addr"]: e for e in trace[:oom] if e["action"] == "alloc"}
    for addr in st.live:
        if addr in last:
            assert last[addr] in kept
    assert len(kept) < len(trace)
    # The same verdict from the trimmed file (steps by the optimizer annotations, kept).
    a, b = explain(full).as_json(), explain(trimmed).as_json()
    if full.get("external_annotations"):
        assert a == b
    else:
        assert (a["pattern"], a["live_sites"][:1], a["failing_site"]) == (b["pattern"], b["live_sites"][:1], b["failing_site"])
    info = dict(snaptrim.trim(full, window=50)[1], bytes=len(data))
    assert line == trimmed_text(str(out), info) and fmt_bytes(len(data)) in line


def test_under_json_the_size_goes_to_stderr(tmp_path):
    out = tmp_path / "t.pickle"
    r = run_cli(os.path.join(FIXTURES, "leak.pickle"), "--json", "--write-trimmed", str(out))
    assert r.returncode == 0 and json.loads(r.stdout)["pattern"] == "leak"
    assert r.stderr.startswith("trimmed snapshot: %s, " % out)


def test_a_window_keeps_that_many_entries_before_the_oom():
    full = original("leak")
    dev, trace = entries(full, None)
    oom = max(i for i, e in enumerate(trace) if e["action"] == "oom")
    small, info = snaptrim.trim(full, window=0)
    big, info_big = snaptrim.trim(full, window=len(trace))
    assert info["entries"] < info_big["entries"] == len(trace) == info["of_entries"]
    assert big["device_traces"][dev] == trace
    allocs = [e for e in small["device_traces"][dev] if e["action"] == "alloc"]
    assert len(small["device_traces"][dev]) == len(allocs) + (len(trace) - oom)


def test_a_snapshot_without_history_keeps_its_segments(tmp_path):
    snap = {"segments": [{"device": 0, "address": 0, "total_size": 4, "stream": 0,
                          "blocks": [{"address": 0, "size": 4, "requested_size": 4, "state": "inactive", "frames": []}]}],
            "device_traces": []}
    info = snaptrim.write(str(tmp_path / "t.pickle"), snap)
    got = pickle.loads((tmp_path / "t.pickle").read_bytes())
    assert got["segments"] == snap["segments"] and info["entries"] == 0 and info["bytes"] > 0
