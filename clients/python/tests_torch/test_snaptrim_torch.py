"""The trimmed snapshot `explain --write-trimmed` writes, opened by torch's own tools: pickle.load
and torch.cuda._memory_viz (its functions and its command line: stats, trace, segments), which
must read it as they read the whole snapshot."""

import inspect
import os
import pickle
import subprocess
import sys

import pytest

import support

torch = support.require("torch")

import torch.cuda._memory_viz as memory_viz  # noqa: E402

from gpumon_client.snapshot import trim as snaptrim  # noqa: E402

FIXTURES = os.path.join(support.REPO_ROOT, "tests", "fixtures", "torch-oom")
CASES = ("pressure", "fragmentation", "leak")


def flamegraph_lines(text):
    return text  # memory_viz's own script is downloaded from GitHub: the lines it would be given


def memory_viz_cli(*args, home):
    # `segments` runs ~/.cache/flamegraph.pl, downloading it when missing: a stand-in is put
    # there so that nothing reaches the network.
    env = dict(os.environ, HOME=str(home))
    return subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args], env=env, cwd=str(home),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def home(tmp_path):
    cache = tmp_path / ".cache"
    cache.mkdir()
    script = cache / "flamegraph.pl"
    script.write_text("#!/bin/sh\nwc -l\n")
    script.chmod(0o755)
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_memory_viz_reads_the_trimmed_file_as_it_reads_the_whole_one(tmp_path, home, case):
    src = os.path.join(FIXTURES, case + ".pickle")
    with open(src, "rb") as f:
        full = pickle.load(f)
    out = tmp_path / "trimmed.pickle"
    info = snaptrim.write(str(out), full, window=100)
    assert out.stat().st_size == info["bytes"] < os.path.getsize(src) or case != "leak"
    with open(out, "rb") as f:
        trimmed = pickle.load(f)  # torch's loader: plain pickle
    # The allocator's state: the same summary, the same flame graph lines, from either file.
    assert memory_viz.segsum(trimmed) == memory_viz.segsum(full)
    assert memory_viz.segments(trimmed, flamegraph_lines) == memory_viz.segments(full, flamegraph_lines)
    # The history: fewer entries, each one torch can print; the OOM is there.
    text = memory_viz.trace(trimmed)
    assert "%d entries" % info["entries"] in text and "raise OutOfMemoryError" in text
    assert "<html>" in memory_viz.trace_plot(trimmed).lower()
    # And the command line, on the file itself.
    for action in ("stats", "trace"):
        a, b = memory_viz_cli(action, str(out), home=home), memory_viz_cli(action, src, home=home)
        assert a.returncode == 0, a.stderr
        if action == "stats":
            assert a.stdout == b.stdout
    if "~/.cache" not in inspect.getsource(memory_viz.format_flamegraph):
        return  # older torch keeps its flame graph script in /tmp, shared: the function is checked above
    seg = memory_viz_cli("segments", str(out), "-o", str(tmp_path / "seg.svg"), home=home)
    assert seg.returncode == 0, seg.stderr
    assert int((tmp_path / "seg.svg").read_text().split()[0]) == len(memory_viz.segments(full, flamegraph_lines).splitlines())
