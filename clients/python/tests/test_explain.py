"""`explain` on the three real H100 OOM snapshots (tests/fixtures/torch-oom: pressure,
fragmentation, leak, each with a JSON naming the lines that matter), synthetic snapshots for the
edge cases, and hostile or broken files."""

import functools
import json
import os
import pickle
import subprocess
import sys

import pytest

from gpumon_client import oomreport
from gpumon_client.snapshot import explain as ex_mod
from gpumon_client.snapshot import load as snapload
from gpumon_client.snapshot.cli import parse_bytes
from gpumon_client.snapshot.explain import explain
from gpumon_client.snapshot.wire import for_wire

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-oom"))
CASES = ("pressure", "fragmentation", "leak")
MIB, GIB = 1 << 20, 1 << 30
KEYS = {"pattern", "request_bytes", "limit_bytes", "allocated_bytes", "reserved_bytes", "reserved_free_bytes",
        "largest_free_block_bytes", "failing_site", "live_sites", "reasons", "remedies", "message"}


def pickle_path(case):
    return os.path.join(FIXTURES, case + ".pickle")


@functools.lru_cache(maxsize=None)
def _load(case):
    return snapload.load(pickle_path(case))


@functools.lru_cache(maxsize=None)
def meta(case):
    with open(os.path.join(FIXTURES, case + ".json")) as f:
        return json.load(f)


def at(site):
    return (os.path.basename(site["file"]), site["line"])


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "gpumon_client", "explain", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


# --- the real OOMs ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_limit", [True, False])
def test_each_real_oom_gets_its_pattern_and_lines(case, with_limit):
    m = meta(case)
    e = explain(_load(case), limit_bytes=m["cap_bytes"] if with_limit else None)
    assert e.pattern == m["pattern"], e.message
    want = m["expect"]
    if "failing_site" in want:
        assert e.failing_site is not None and at(e.failing_site) == (want["failing_site"]["file"], want["failing_site"]["line"])
        assert "%s:%d" % at(e.failing_site) in e.message
    if "top_live_site" in want:
        top = e.live_sites[0]
        assert (top.short()) == "%s:%d" % (want["top_live_site"]["file"], want["top_live_site"]["line"])
        assert top.short() in e.message
    assert e.history and e.remedies and e.reasons


def test_the_leak_oom_raised_in_backward_has_no_failing_line_and_says_why():
    e = explain(_load("leak"), limit_bytes=meta("leak")["cap_bytes"])
    assert e.failing_site is None
    assert any("no Python frame" in r for r in e.reasons)
    top = e.live_sites[0]
    # Allocated from step 10 to the OOM at 125, one 32 MiB copy a step, never freed.
    assert top.blocks >= 100 and top.bytes == top.blocks * 32 * MIB
    assert "loss.item()" in e.remedies[0] and "oomlib.py:26" in e.remedies[0]


def test_the_state_at_the_oom_matches_what_torch_said_then():
    # The leak's snapshot was dumped after the exception unwound (frees after the `oom` entry);
    # torch's message at the OOM said 48.98 MiB reserved but unallocated: the undo must find it.
    e = explain(_load("leak"))
    assert abs(e.reserved_free_bytes / MIB - 48.98) < 0.01
    assert e.largest_free_block_bytes < e.request_bytes == 64 * MIB
    f = explain(_load("fragmentation"))
    stats = meta("fragmentation")["stats_at_oom"]
    assert f.allocated_bytes == stats["allocated_bytes.all.current"]
    assert f.reserved_bytes == stats["reserved_bytes.all.current"]
    assert f.reserved_free_bytes == stats["inactive_split_bytes.all.current"]
    assert f.largest_free_block_bytes == 13 * MIB  # a 20 MiB segment less the 7 MiB survivor


def test_pressure_says_the_single_request_is_larger_than_the_limit():
    e = explain(_load("pressure"), limit_bytes=4 * GIB)
    assert e.request_bytes == 9 * GIB
    assert "larger than the 4.00 GiB allowed" in e.reasons[0]
    # Without the cap, the device's free memory shows that a cap was hit.
    e = explain(_load("pressure"))
    assert e.pattern == "pressure" and any("--limit" in r for r in e.reasons)


# --- synthetic edge cases -----------------------------------------------------------------------

USER = "/home/u/train.py"


def frame(line, fn="step", file=USER):
    return {"filename": file, "line": line, "name": fn}


def seg(addr, blocks):
    return {"device": 0, "address": addr, "total_size": sum(b["size"] for b in blocks), "blocks": blocks}


def block(addr, size, state="active_allocated", frames=None):
    b = {"address": addr, "size": size, "state": state}
    if frames is not None:
        b["frames"] = frames
    return b


def entry(action, addr, size, t, frames=()):
    return {"action": action, "addr": addr, "size": size, "time_us": t, "frames": list(frames)}


def fragmented(history=True, oom=True, ooms=1):
    """Ten 20 MiB segments, each pinned by one live 2 MiB block; a 64 MiB request fails."""
    segs, trace, t = [], [], 0
    for i in range(10):
        base = (i + 1) << 32
        fr = [frame(10, "pin")] if history else None
        segs.append(seg(base, [block(base, 2 * MIB, frames=fr), block(base + 2 * MIB, 18 * MIB, "inactive")]))
        if history:
            trace.append(entry("alloc", base, 2 * MIB, t, [frame(10, "pin")]))
            t += 1
    for k in range(ooms if oom else 0):
        trace.append(entry("oom", 0, (64 + k) * MIB, t + k, [frame(20 + k, "big")]))
    snap = {"segments": segs}
    if history:
        snap["device_traces"] = [trace]
    return snap


def test_no_history_still_classifies_from_the_segments_and_says_the_lines_are_unknown():
    e = explain(fragmented(history=False), request_bytes=64 * MIB, limit_bytes=40 * GIB)
    assert e.pattern == "fragmentation"
    assert e.failing_site is None and e.live_sites == [] and not e.history
    assert any("history was not recording" in r for r in e.reasons)
    assert e.reserved_free_bytes == 180 * MIB and e.largest_free_block_bytes == 18 * MIB


def test_no_oom_in_the_snapshot_is_none():
    assert explain(fragmented(oom=False)).pattern == "none"
    e = explain(fragmented(history=False))
    assert e.pattern == "none" and "--request" in e.reasons[0]


def test_several_ooms_explain_the_latest():
    e = explain(fragmented(ooms=3))
    assert e.request_bytes == 66 * MIB and e.failing_site["line"] == 22
    assert any("3 OOMs" in r for r in e.reasons)


def test_a_request_larger_than_the_device_is_pressure():
    e = explain(fragmented(history=False), request_bytes=100 * GIB, limit_bytes=80 * GIB)
    assert e.pattern == "pressure" and "larger than the 80.00 GiB allowed" in e.reasons[0]


def leaking(steps=20, truncated=0, share_blocks=1):
    """A trainer keeping one 8 MiB block per optimizer step at train.py:30, next to 40 MiB of
    weights; with `truncated`, that many of the first steps fell out of the history."""
    segs, trace, notes = [], [], []
    weights = 1 << 40
    segs.append(seg(weights, [block(weights, 40 * MIB, frames=[frame(5, "<module>")])]))
    trace.append(entry("alloc", weights, 40 * MIB, 0, [frame(5, "<module>")]))
    for s in range(steps):
        t = 100 * (s + 1)
        notes.append({"stage": "START", "name": "Optimizer.step#SGD.step", "time_us": t})
        addr = (s + 2) << 32
        segs.append(seg(addr, [block(addr, 8 * MIB * share_blocks, frames=[frame(30, "keep")])]))
        if s >= truncated:
            trace.append(entry("alloc", addr, 8 * MIB * share_blocks, t + 1, [frame(30, "keep")]))
            trace.append(entry("alloc", 7, 4 * MIB, t + 2, [frame(31, "keep")]))  # a temporary
            trace.append(entry("free_completed", 7, 4 * MIB, t + 3))
    trace.append(entry("oom", 0, 16 * MIB, 100 * steps + 50, [frame(31, "keep")]))
    return {"segments": segs, "device_traces": [trace], "external_annotations": notes}


def test_a_leak_is_named_with_its_steps():
    e = explain(leaking(), limit_bytes=200 * MIB)
    assert e.pattern == "leak" and e.live_sites[0].short() == "train.py:30"
    assert "20 steps" in e.message


def test_history_truncated_by_max_entries_still_finds_the_leak_and_says_so():
    e = explain(leaking(steps=20, truncated=8), limit_bytes=200 * MIB)
    assert e.pattern == "leak"
    assert "12 steps" in e.message and any("8 blocks from before the recorded history" in r for r in e.reasons)


def test_few_steps_or_a_small_share_is_not_a_leak():
    assert explain(leaking(steps=ex_mod.LEAK_MIN_STEPS - 1)).pattern != "leak"
    e = explain(leaking(steps=10), limit_bytes=200 * MIB)
    assert e.pattern == "leak"  # 80 MiB of 120 MiB live
    small = leaking(steps=10)
    small["segments"][0]["blocks"][0]["size"] = 400 * MIB  # the weights now dwarf it (16%)
    assert explain(small).pattern != "leak"


@pytest.mark.parametrize("snap", [
    {}, [], "segments", {"segments": "nope"}, {"segments": [{"blocks": [{"state": 1, "size": 2}]}]},
    {"segments": [], "device_traces": "x"}, {"segments": [], "device_traces": [[{"action": "oom"}]]},
    {"segments": [seg(0, [block(0, 4, frames=["junk", 3, None])])], "device_traces": [[entry("oom", 0, 8, 1, ["junk"])]]},
])
def test_other_shapes_are_unknown_with_a_reason_never_a_traceback(snap):
    e = explain(snap)
    assert e.pattern in ("unknown", "none", "pressure") and e.reasons and e.message
    json.dumps(e.as_json())


# --- the line sent to the daemon ----------------------------------------------------------------


def test_for_wire_fits_the_line_and_the_protocols_limits():
    e = explain(_load("leak"), limit_bytes=4 * GIB)
    long = "/very/" + "deep/" * 300 + "x.py"
    for s in e.live_sites:
        s.stack = [{"file": long, "line": i, "function": "f" * 900} for i in range(60)]
    e.live_sites = e.live_sites * 10
    e.reasons = ["r" * 2000] * 12
    e.failing_site = {"file": long, "line": 1, "function": "g", "stack": [{"file": long, "line": 1, "function": "g"}] * 50}
    d = for_wire(e, 20000)
    assert len(json.dumps(d)) <= 20000
    assert set(d) >= KEYS and len(d["live_sites"]) <= 20 and len(d["reasons"]) <= 8
    assert all(len(s["stack"]) <= 32 for s in d["live_sites"]) and len(d["failing_site"]["stack"]) <= 32
    assert all(len(r.encode()) <= 512 for r in d["reasons"]) and len(d["failing_site"]["file"].encode()) <= 512


def test_at_oom_reads_the_snapshot_and_never_raises():
    d = oomreport.at_oom(0, 1536 * MIB, 4 * GIB, snapshot=lambda: _load("fragmentation"))
    assert d["pattern"] == "fragmentation" and d["failing_site"]["line"] == 37 and d["limit_bytes"] == 4 * GIB
    assert len(json.dumps(d)) < 65536

    def broken():
        raise RuntimeError("CUDA driver error")

    d = oomreport.at_oom(0, MIB, GIB, snapshot=broken)
    assert d["pattern"] == "unknown" and "CUDA driver error" in d["reasons"][0] and d["request_bytes"] == MIB


# --- the command line ---------------------------------------------------------------------------


def test_cli_json_has_the_documented_fields():
    r = run_cli(pickle_path("fragmentation"), "--json", "--limit", "4GiB", "--top", "3")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) >= KEYS and d["pattern"] == "fragmentation" and d["limit_bytes"] == 4 * GIB
    assert len(d["live_sites"]) <= 3 and d["live_sites"][0]["line"] == 32
    assert {"file", "line", "function", "bytes", "blocks", "stack"} <= set(d["live_sites"][0])
    assert {"file", "line", "function", "stack"} <= set(d["failing_site"])


def test_cli_text_is_a_paragraph_then_the_sites():
    r = run_cli(pickle_path("leak"), "--limit", "4GiB")
    assert r.returncode == 0, r.stderr
    head = r.stdout.split("\n\n")[0]
    assert head.startswith("leak: ") and "oomlib.py:26" in head and "remedy:" in r.stdout
    assert "allocated at" in r.stdout and "oomlib.py:26 in dev_history" in r.stdout


def test_cli_refuses_a_pickle_that_would_run_code(tmp_path):
    target = tmp_path / "ran"
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"cos\nsystem\n(S'touch %s'\ntR." % str(target).encode())
    r = run_cli(str(bad))
    assert r.returncode == 2 and not target.exists()
    assert str(bad) in r.stderr and "refused" in r.stderr and "Traceback" not in r.stderr


def test_cli_names_a_truncated_or_missing_file(tmp_path):
    cut = tmp_path / "cut.pickle"
    with open(pickle_path("pressure"), "rb") as f:
        cut.write_bytes(f.read()[:5000])
    for p in (cut, tmp_path / "missing.pickle"):
        r = run_cli(str(p))
        assert r.returncode == 2 and str(p) in r.stderr and "Traceback" not in r.stderr


def test_cli_a_readable_pickle_of_another_shape_is_unknown(tmp_path):
    p = tmp_path / "list.pickle"
    p.write_bytes(pickle.dumps([1, 2, 3]))
    r = run_cli(str(p), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["pattern"] == "unknown"


def test_cli_escapes_control_characters_from_the_file(tmp_path):
    snap = fragmented()
    snap["device_traces"][0][-1]["frames"] = [frame(20, "big\x1b[2J\x07", file="/home/u/ev\x1bil.py")]
    p = tmp_path / "esc.pickle"
    p.write_bytes(pickle.dumps(snap))
    r = run_cli(str(p))
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\x07" not in r.stdout and "\\x1b" in r.stdout


@pytest.mark.parametrize("text,value", [("4GiB", 4 * GIB), ("512MiB", 512 * MIB), ("1234", 1234), ("1.5g", 1536 * MIB)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_cli_names_a_bad_limit():
    r = run_cli(pickle_path("pressure"), "--limit", "lots")
    assert r.returncode == 2 and "'lots' is not a byte count" in r.stderr


def test_an_empty_snapshot_is_unknown_unless_the_request_alone_exceeds_the_limit():
    # What torch.cuda.memory._snapshot() returns where CUDA never initialised.
    empty = {"segments": [], "device_traces": [], "allocator_settings": {}, "external_annotations": []}
    e = explain(empty, request_bytes=GIB, limit_bytes=4 * GIB)
    assert e.pattern == "unknown" and "no memory segments" in e.reasons[0]
    assert explain(empty, request_bytes=8 * GIB, limit_bytes=4 * GIB).pattern == "pressure"


def test_cli_budget_caps_what_is_kept_and_max_size_is_the_same_budget(tmp_path):
    for flag in ("--budget", "--max-size"):
        r = run_cli(pickle_path("leak"), flag, "1")
        assert r.returncode == 2 and r.stdout == ""
        assert "what it needs kept exceeds the budget of 1.0 MiB at offset" in r.stderr and "--budget MIB" in r.stderr
    assert run_cli(pickle_path("leak"), "--budget", "64").returncode == 0
