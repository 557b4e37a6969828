"""The snapshot diff on the real H100 snapshots (tests/fixtures/torch-snapshots, made by its
train.py, whose line numbers the frames carry): the right line for each leak, nothing for the
healthy run, and the rules behind that (user frames, growth in blocks, in-step notes, fitting a
protocol line)."""

import copy
import functools
import json
import os
import subprocess
import sys

import pytest

from gpumon_client.snapshot.cli import diff_main
from gpumon_client.snapshot.diff import Report, Site, diff
from gpumon_client.snapshot.load import SnapshotError, load
from gpumon_client.snapshot.render import diff_text
from gpumon_client.snapshot.sites import is_user_file
from gpumon_client.snapshot.wire import fit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-snapshots"))
TRAIN = "/home/alice/proj/train.py"
MIB = 1 << 20


def path(pair, step):
    return os.path.join(FIXTURES, "%s-step%d.pickle" % (pair, step))


@functools.lru_cache(maxsize=None)
def _snap(pair, step):
    return load(path(pair, step))


def snap(pair, step):
    return copy.deepcopy(_snap(pair, step))  # tests may edit their copy


def live_blocks(s):
    return [b for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]


def at(block, line):
    return any(f["filename"] == TRAIN and f["line"] == line for f in block["frames"])


def lines_of(report):
    return [(os.path.basename(s.file), s.line, s.function) for s in report.sites]


# --- the fixtures' expected results (tests/fixtures/torch-snapshots/README.md) -------------------


def test_kept_outputs_names_train_py_27():
    r = diff(snap("leak-kept-outputs", 60), snap("leak-kept-outputs", 180))
    assert lines_of(r) == [("train.py", 27, "kept_outputs")]
    s = r.sites[0]
    assert (s.bytes, s.blocks, s.file) == (120 * MIB, 120, TRAIN)
    assert s.stack == [
        {"file": TRAIN, "line": 27, "function": "kept_outputs"},
        {"file": TRAIN, "line": 48, "function": "run"},
        {"file": TRAIN, "line": 69, "function": "<module>"},
    ]
    assert s.note is None
    assert r.total_growth_bytes == 120 * MIB and r.grew()


def test_eval_graph_splits_between_34_and_47_and_says_they_grow_in_step():
    r = diff(snap("leak-eval-graph", 60), snap("leak-eval-graph", 180))
    assert lines_of(r) == [("train.py", 34, "eval_without_no_grad"), ("train.py", 47, "run")]
    kept, batches = r.sites
    assert (kept.bytes, kept.blocks) == (24 * MIB, 96)
    assert (batches.bytes, batches.blocks) == (24 * MIB, 24)
    assert r.total_growth_bytes == 48 * MIB
    assert [f["line"] for f in kept.stack] == [34, 48, 70]
    assert [f["line"] for f in batches.stack] == [47, 70]
    # Each note names the other; the batches' note says what likely keeps them (the kept eval
    # outputs, reached from line 48 after line 47 allocated them), as a likelihood.
    assert kept.note.startswith("grows in step with train.py:47 (96 blocks here, 24 there)")
    assert "likely keeps train.py:47's memory alive" in kept.note
    assert batches.note.startswith("grows in step with train.py:34 (24 blocks here, 96 there)")
    assert "run allocates these at line 47 and then reaches train.py:34 from line 48" in batches.note
    for note in (kept.note, batches.note):
        assert "likely" in note and "view" in note and len(note.encode()) <= 512


def test_healthy_attributes_nothing():
    r = diff(snap("healthy", 60), snap("healthy", 180))
    assert r.sites == [] and not r.grew()
    assert r.total_growth_bytes == 0
    # Not even below the 1 MiB floor: nothing in the healthy run gained a live block.
    assert diff(snap("healthy", 60), snap("healthy", 180), min_bytes=0).sites == []


def test_a_leak_read_backwards_and_a_snapshot_against_itself_attribute_nothing():
    for pair in ("leak-kept-outputs", "leak-eval-graph", "healthy"):
        r = diff(snap(pair, 180), snap(pair, 60))
        assert r.sites == [] and r.total_growth_bytes == 0, pair
        assert diff(snap(pair, 180), snap(pair, 180), min_bytes=0).sites == []


# --- the rule: growth in live blocks, not bytes alone -------------------------------------------


def resize(s, line, factor):
    """The healthy run's AFTER as if that step's batch had another size: each live block
    allocated at `line` (the batch, the output) replaced by one `factor` times its size."""
    n = 0
    for b in live_blocks(s):
        if at(b, line):
            b["size"] = int(b["size"] * factor)
            b["requested_size"] = int(b["requested_size"] * factor)
            n += 1
    assert n, line
    return s


def add_blocks(s, line, count, size):
    """`count` more live blocks allocated at `line` (copies of one that is there)."""
    seg = next(seg for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated" and at(b, line))
    proto = next(b for b in seg["blocks"] if b["state"] == "active_allocated" and at(b, line))
    for i in range(count):
        b = copy.deepcopy(proto)
        b["size"] = size
        b["address"] += (i + 1) << 40
        seg["blocks"].append(b)
    return s


def test_healthy_with_a_batch_size_that_varies_attributes_nothing():
    # Lines 39 (the output) and 47 (the batch) hold one live block each at both snapshots; a
    # bigger (or smaller) batch at AFTER replaces them by a bigger (or smaller) block.
    for factor in (4, 0.25, 1.5):
        after = resize(resize(snap("healthy", 180), 47, factor), 39, factor)
        r = diff(snap("healthy", 60), after)
        assert r.sites == [], factor
        if factor > 1:
            assert r.total_growth_bytes == 2 * MIB * (factor - 1)
    # A bigger batch *and* kept blocks: the kept blocks are growth, with the batch's change in bytes.
    after = add_blocks(resize(snap("healthy", 180), 47, 2), 47, 10, MIB)
    r = diff(snap("healthy", 60), after)
    assert [(s.line, s.blocks, s.bytes) for s in r.sites] == [(47, 10, 11 * MIB)]


def test_min_bytes_and_top():
    before, after = snap("leak-eval-graph", 60), snap("leak-eval-graph", 180)
    assert diff(before, after, min_bytes=24 * MIB + 1).sites == []
    assert lines_of(diff(before, after, top=1)) == [("train.py", 34, "eval_without_no_grad")]
    small = add_blocks(snap("healthy", 180), 47, 3, 4096)
    assert diff(snap("healthy", 60), small).sites == []
    assert [(s.line, s.blocks) for s in diff(snap("healthy", 60), small, min_bytes=0).sites] == [(47, 3)]


def test_sites_not_in_step_get_no_note():
    after = snap("leak-eval-graph", 180)
    # One of the 36 batch blocks alive at step 180 freed: 23 new blocks against 96 is no whole ratio.
    seg = next(seg for seg in after["segments"] for b in seg["blocks"] if b["state"] == "active_allocated" and at(b, 47) and len(b["frames"]) == 2)
    blk = next(b for b in seg["blocks"] if b["state"] == "active_allocated" and at(b, 47) and len(b["frames"]) == 2)
    blk["state"] = "inactive"
    r = diff(snap("leak-eval-graph", 60), after)
    assert [(s.line, s.blocks) for s in r.sites] == [(34, 96), (47, 23)]
    assert [s.note for s in r.sites] == [None, None]


# --- which frame is the site ---------------------------------------------------------------------


def test_user_frames():
    yes = ["/home/alice/proj/train.py", "train.py", "C:\\work\\proj\\train.py", "<ipython-input-3-1a2b>",
           "/tmp/ipykernel_4242/123.py", "/home/alice/torch-experiments/model.py"]
    no = ["/home/alice/.venv/lib/python3.12/site-packages/torch/nn/functional.py",
          "/usr/lib/python3/dist-packages/numpy/core.py", "/opt/pytorch/torch/nn/modules/module.py",
          "/home/alice/.venv/lib/python3.12/site-packages/transformers/trainer.py",
          "/srv/gpumon/clients/python/gpumon_client/hooks.py", "/usr/lib/python3.11/contextlib.py",
          "/opt/conda/lib/python3.10/functools.py", "<frozen runpy>", "<string>", "<eval_with_key>.3",
          "/tmp/torchinductor_alice/ab/cab12.py", "??", "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
          "/usr/lib/libtorch_cuda.so", ""]
    assert [f for f in yes if not is_user_file(f)] == []
    assert [f for f in no if is_user_file(f)] == []


def one_block_snapshot(frames, size=4 * MIB, count=1):
    blocks = [{"address": i, "size": size, "requested_size": size, "state": "active_allocated",
               "frames": [{"filename": f, "line": n, "name": fn} for f, n, fn in frames]} for i in range(count)]
    return {"segments": [{"blocks": blocks}]}


TORCH = "/v/lib/python3.12/site-packages/torch/nn/modules/module.py"


def test_the_site_is_the_innermost_user_frame_and_the_stack_its_user_frames_outward():
    frames = [("??", 0, "c10::cuda::alloc"), (TORCH, 10, "forward"), ("/p/model.py", 5, "forward"),
              (TORCH, 1790, "_call_impl"), ("/p/train.py", 30, "step"), ("/p/train.py", 50, "<module>")]
    r = diff({"segments": []}, one_block_snapshot(frames, count=2))
    s = r.sites[0]
    assert (s.file, s.line, s.function, s.blocks, s.bytes) == ("/p/model.py", 5, "forward", 2, 8 * MIB)
    assert [(f["file"], f["line"]) for f in s.stack] == [("/p/model.py", 5), ("/p/train.py", 30), ("/p/train.py", 50)]


def test_without_a_user_frame_the_site_is_the_innermost_python_frame():
    frames = [("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 900, "malloc"), (TORCH, 10, "forward"),
              ("/usr/lib/python3.12/runpy.py", 88, "_run_code")]
    s = diff({"segments": []}, one_block_snapshot(frames)).sites[0]
    assert (s.file, s.line) == (TORCH, 10)
    assert [f["line"] for f in s.stack] == [10, 88]
    s = diff({"segments": []}, one_block_snapshot([("??", 0, "x"), ("libfoo.so", 0, "y")])).sites[0]
    assert (s.file, s.function) == ("??", "x")


def test_the_stack_that_gained_the_blocks_stands_for_the_site():
    util = [("/p/util.py", 7, "keep")]
    before = one_block_snapshot(util + [("/p/train.py", 10, "a")], count=5)
    after = one_block_snapshot(util + [("/p/train.py", 10, "a")], count=5)
    after["segments"][0]["blocks"] += one_block_snapshot(util + [("/p/train.py", 20, "b")], count=3)["segments"][0]["blocks"]
    s = diff(before, after).sites[0]
    assert (s.line, s.blocks) == (7, 3)
    assert [f["line"] for f in s.stack] == [7, 20]


def test_torch_2_0_history_format():
    def legacy(s):
        for b in live_blocks(s):
            b["history"] = [{"addr": b["address"], "real_size": b["requested_size"], "frames": b.pop("frames")}]
        return s

    r = diff(legacy(snap("leak-kept-outputs", 60)), legacy(snap("leak-kept-outputs", 180)))
    assert [(s.line, s.bytes) for s in r.sites] == [(27, 120 * MIB)]


def test_malformed_frames_read_as_unknown_and_the_skeleton_is_checked():
    s = one_block_snapshot([("/p/train.py", 3, "f")])
    s["segments"][0]["blocks"][0]["frames"] = [{"filename": 5, "line": "x"}, "junk"]
    assert [(x.file, x.line, x.function) for x in diff({"segments": []}, s).sites] == [("?", 0, "?")]
    with pytest.raises(SnapshotError, match="^after: not a torch.cuda.memory snapshot"):
        diff({"segments": []}, {"blocks": []})


def strip_stacks(s):
    for b in live_blocks(s):
        b["frames"] = []
    return s


def test_snapshots_without_stacks_say_so_and_count_the_growth_apart(capsys, tmp_path):
    r = diff(strip_stacks(snap("leak-kept-outputs", 60)), strip_stacks(snap("leak-kept-outputs", 180)))
    assert r.sites == [] and not r.stacks_recorded
    assert (r.no_stack_bytes, r.no_stack_blocks) == (120 * MIB, 120) and r.grew()
    text = diff_text(r, "a.pickle", "b.pickle")
    assert "b.pickle has no allocation stacks" in text and "_record_memory_history" in text
    assert "120.0 MiB in 120 more live blocks without a stack" in text


def test_the_text_escapes_control_characters_from_the_file():
    # Paths and function names come from the pickle: they reach the terminal escaped.
    after = snap("leak-kept-outputs", 180)
    for b in live_blocks(after):
        for f in b["frames"]:
            if f["filename"] == TRAIN:
                f["filename"], f["name"] = "/home/alice/proj/ev\x1bil.py", "kept\x1b[2J\x07"
    text = diff_text(diff(snap("leak-kept-outputs", 60), after), "a.pickle", "b\x1b.pickle")
    assert "ev\\x1bil.py:27 in kept\\x1b[2J\\x07" in text and "b\\x1b.pickle" in text
    assert "\x1b" not in text and "\x07" not in text


# --- fitting a protocol line ---------------------------------------------------------------------


def eval_graph_json():
    return diff(snap("leak-eval-graph", 60), snap("leak-eval-graph", 180)).as_json()["sites"]


def test_fit_keeps_what_fits_and_trims_outer_frames_first():
    sites = eval_graph_json()
    full = len(json.dumps(sites))
    assert fit(sites, full) == sites and fit(sites, 65536) == sites
    trimmed = fit(sites, full - 1)
    assert len(json.dumps(trimmed)) <= full - 1
    # The longest stack (34: three frames) lost its outermost frame; the sites are all there.
    assert [[f["line"] for f in s["stack"]] for s in trimmed] == [[34, 48], [47, 70]]
    no_stacks = [dict(s, stack=[]) for s in sites]
    tight = len(json.dumps(no_stacks))
    assert fit(sites, tight) == no_stacks
    one = fit(sites, tight - 1)
    assert one == no_stacks[:1] and len(json.dumps(one)) <= tight - 1
    assert fit(sites, 1) == []
    assert sites == eval_graph_json()  # the input is left as it was


def test_fit_caps_strings_stacks_and_sites():
    frame = {"file": "/p/" + "é" * 400 + ".py", "line": 1, "function": "f\udc80" + "x" * 600}
    site = {"file": frame["file"], "line": 1, "function": "g", "bytes": 5, "blocks": 1,
            "stack": [dict(frame, line=i) for i in range(40)], "note": "n" * 1000}
    out = fit([site] * 25, 1 << 30)
    assert len(out) == 20
    s = out[0]
    assert len(s["stack"]) == 32 and [f["line"] for f in s["stack"]] == list(range(32))
    for text in (s["file"], s["note"], s["stack"][0]["file"], s["stack"][0]["function"]):
        assert len(text.encode("utf-8")) <= 512
    assert s["file"].startswith("/p/é") and len(s["file"].encode()) == 511  # no half character
    assert s["stack"][0]["function"].startswith("f?x")  # a lone surrogate cannot go on the wire
    # And with a real budget, every site and frame that fits stays.
    budget = 65536 - 200
    fitted = fit([site] * 25, budget)
    assert len(json.dumps(fitted)) <= budget and len(fitted) == 20
    assert all(len(x["stack"]) <= 32 for x in fitted)


def test_as_json_is_the_protocols_shape():
    r = diff(snap("leak-eval-graph", 60), snap("leak-eval-graph", 180))
    j = r.as_json()
    assert set(j) == {"sites", "total_growth_bytes"}
    assert set(j["sites"][0]) == {"file", "line", "function", "bytes", "blocks", "stack", "note"}
    assert set(Site("f", 1, "g", 1, 1, []).as_json()) == {"file", "line", "function", "bytes", "blocks", "stack"}
    assert Report(0, []).as_json() == {"sites": [], "total_growth_bytes": 0}


# --- the command ---------------------------------------------------------------------------------


def run_diff(*args):
    return subprocess.run([sys.executable, "-m", "gpumon_client", "diff", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_command_text_and_exit_status():
    proc = run_diff(path("leak-eval-graph", 60), path("leak-eval-graph", 180))
    assert proc.returncode == 1 and proc.stderr == ""
    out = proc.stdout.splitlines()
    assert out[0] == "live memory grew by 48.0 MiB (282.1 MiB -> 330.1 MiB)"
    rows = [l for l in out if "MiB" in l and " in " in l and "%" in l]
    assert rows == ["  24.0 MiB      +96    50%  train.py:34 in eval_without_no_grad",
                    "  24.0 MiB      +24    50%  train.py:47 in run"]
    assert "      at /home/alice/proj/train.py:47 in run" in out
    assert all(len(l) <= 100 for l in out)
    proc = run_diff(path("healthy", 60), path("healthy", 180))
    assert proc.returncode == 0 and "no allocation site grew by 1.0 MiB or more" in proc.stdout


def test_command_json():
    proc = run_diff("--json", "--top", "5", path("leak-kept-outputs", 60), path("leak-kept-outputs", 180))
    assert proc.returncode == 1
    j = json.loads(proc.stdout)
    assert j["total_growth_bytes"] == 120 * MIB
    assert [(os.path.basename(s["file"]), s["line"], s["function"], s["bytes"], s["blocks"]) for s in j["sites"]] == [
        ("train.py", 27, "kept_outputs", 120 * MIB, 120)]
    proc = run_diff("--json", path("leak-eval-graph", 60), path("leak-eval-graph", 180))
    sizes = [s["bytes"] for s in json.loads(proc.stdout)["sites"]]
    assert sizes == sorted(sizes, reverse=True) and len(sizes) == 2
    proc = run_diff(path("healthy", 60), path("healthy", 180), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"sites": [], "total_growth_bytes": 0}


def test_command_usage_errors_exit_2():
    for args in ([], [path("healthy", 60)], ["--top", "0", "a", "b"], ["--min-bytes", "x", "a", "b"], ["--bogus", "a", "b"]):
        proc = run_diff(*args)
        assert proc.returncode == 2 and "usage: python -m gpumon_client diff" in proc.stderr, args
    assert run_diff("--help").returncode == 0


def test_main_in_process(capsys):
    assert diff_main([path("leak-kept-outputs", 60), path("leak-kept-outputs", 180), "--min-bytes", str(121 * MIB)]) == 0
    assert "no allocation site grew by 121.0 MiB or more" in capsys.readouterr().out
    from gpumon_client.__main__ import main

    assert main(["diff", path("leak-kept-outputs", 60), path("leak-kept-outputs", 180)]) == 1
    assert "train.py:27 in kept_outputs" in capsys.readouterr().out
