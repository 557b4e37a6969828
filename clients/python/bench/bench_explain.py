#!/usr/bin/env python3
"""What explaining an OOM costs, on the real H100 OOM snapshots (tests/fixtures/torch-oom).

1. `python -m gpumon_client explain leak.pickle` as a user runs it: the whole command, interpreter
   start included (goal: at most 1 s on the 0.8 MB leak snapshot).
2. In the trainer, at the OOM: what the observer adds once `_snapshot()` returned (explain and
   fitting the line), per fixture. `_snapshot()` itself is torch's and needs a GPU.
3. While armed: the step peak's replay of the recorded history (snapshot/peak.py), per fixture.

    python3 clients/python/bench/bench_explain.py [--runs N]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(CLIENT))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "torch-oom")
sys.path.insert(0, CLIENT)

from gpumon_client import oomreport  # noqa: E402
from gpumon_client.snapshot import load as snapload  # noqa: E402
from gpumon_client.snapshot import peak  # noqa: E402
from gpumon_client.snapshot.explain import explain  # noqa: E402


def timed(fn, runs):
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def fmt(xs):
    xs = sorted(xs)
    return "median %.1f ms (min %.1f, max %.1f, n=%d)" % (
        1e3 * statistics.median(xs), 1e3 * xs[0], 1e3 * xs[-1], len(xs))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--max-cli-seconds", type=float, default=1.0)
    args = p.parse_args()
    leak = os.path.join(FIXTURES, "leak.pickle")
    cli = timed(lambda: subprocess.run([sys.executable, "-m", "gpumon_client", "explain", leak], cwd=CLIENT,
                                       check=True, stdout=subprocess.DEVNULL), args.runs)
    print("explain CLI, leak.pickle (%.0f KB): %s" % (os.path.getsize(leak) / 1e3, fmt(cli)))
    for case in ("pressure", "fragmentation", "leak"):
        path = os.path.join(FIXTURES, case + ".pickle")
        load = timed(lambda: snapload.load(path), args.runs)
        snap = snapload.load(path)
        inproc = timed(lambda: explain(snap, limit_bytes=4 << 30), args.runs)
        observer = timed(lambda: oomreport.at_oom(0, None, 4 << 30, snapshot=lambda: snap), args.runs)
        replay = timed(lambda: peak.find(snap), args.runs)
        print("%-13s load %s; explain %s; observer after _snapshot() %s; step peak replay %s" % (
            case, fmt(load), fmt(inproc), fmt(observer), fmt(replay)))
    worst = statistics.median(cli)
    if worst > args.max_cli_seconds:
        print("FAIL: explain CLI median %.2f s > %.2f s" % (worst, args.max_cli_seconds))
        return 1
    print("ok: explain CLI median %.2f s <= %.2f s" % (worst, args.max_cli_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
