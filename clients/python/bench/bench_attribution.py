#!/usr/bin/env python3
"""What offering leak attribution costs a trainer's step, measured on this machine (no GPU).

1. A step with no window open, through attach()'s optimizer hook on a step the cadence does not
   sample: this client against another client tree (--baseline DIR holding a gpumon_client, or
   `--baseline-ref REF` to take it from git), both in this process, timed in interleaved blocks.
2. A sampled step: Client.sample() against a live reader, with attribution offered (it then reads
   the socket at every send) and not offered.
3. A step while a window is open (the window's bookkeeping; recording itself is torch's cost,
   ~21% of a 1.6 ms H100 step, measured when the fixture snapshots were made).
4. The window's edges in the trainer: the diff and the line fitting on the H100 fixture pair.

    $(scripts/torch-venv newest)/bin/python clients/python/bench/bench_attribution.py [--baseline-ref HEAD]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(CLIENT))
SNAPS = os.path.join(REPO, "tests", "fixtures", "torch-snapshots")

class Variant:
    """One client package (the tree under `root`, imported as `name`) attached to a live reader,
    its hook on a step the cadence does not sample ready to time."""

    def __init__(self, name, root, sock, mode):
        import importlib

        if name != "gpumon_client":
            # The baseline's own copy, under another name: its imports are relative.
            shutil.copytree(os.path.join(root, "gpumon_client"), os.path.join(os.path.dirname(sock), name))
            sys.path.insert(0, os.path.dirname(sock))
        pkg = importlib.import_module(name)
        hooks = importlib.import_module(name + ".hooks")
        cadence = importlib.import_module(name + ".cadence")
        protocol = importlib.import_module(name + ".protocol")
        kw = {}
        if mode != "plain":
            snapsource = importlib.import_module(name + ".snapsource")

            class Tiny(snapsource.SnapshotSource):  # the window's edges are timed apart
                def snapshot(self):
                    return {"segments": []}

            kw["attribution"] = Tiny() if mode in ("offered", "open") else False
        stats = {k: 1 << 30 for k in protocol.KNOWN_STATS_KEYS}
        self.client = pkg.Client("bench", source=pkg.StaticStatsSource(stats, (1 << 34, 1 << 35)), socket=sock, jitter=False, **kw)
        self.state = hooks.Attachment(self.client, cadence.Cadence(every=10**9, max_rate=None, budget=None))
        self.opt = object()
        self.state.on_optimizer_step(self.opt)  # the cadence's first step: connects, samples
        deadline = time.monotonic() + 3
        while self.client.stats()["session"] is None and time.monotonic() < deadline:
            time.sleep(0.001)
        if mode == "open":
            a = self.client.attributor
            a._open(self.client.transport.connects, protocol.AttributeRequest(id=1, steps=10**12, seconds=1e12), self.state.step)
            self.state.on_optimizer_step(self.opt)  # the window's first snapshot
            assert a.window is not None and a.window.before is not None
        self.mode = mode
        self.hook_ns, self.sample_us = [], []
        self._i = 0

    def time_hook(self, n):
        step, opt = self.state.on_optimizer_step, self.opt
        t = time.perf_counter()
        for _ in range(n):
            step(opt)
        self.hook_ns.append((time.perf_counter() - t) / n * 1e9)

    def time_samples(self, n):
        sample = self.client.sample
        t = time.perf_counter()
        for _ in range(n):
            self._i += 1
            sample(step=self._i)
        self.sample_us.append((time.perf_counter() - t) / n * 1e6)
        time.sleep(0.01)  # lets the reader catch up between blocks

    def check(self):
        if self.mode == "open":
            assert self.client.attributor.window is not None  # every timed step paid its bookkeeping


def baseline_from_git(ref, into):
    """The client package as it is at `ref` (read with git archive; the work tree is untouched)."""
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "clients/python/gpumon_client"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return os.path.join(into, "clients", "python")


def edges():
    sys.path.insert(0, CLIENT)
    from gpumon_client import attribution, protocol
    from gpumon_client.snapshot import diff as snapdiff
    from gpumon_client.snapshot.load import load

    before = load(os.path.join(SNAPS, "leak-kept-outputs-step60.pickle"))
    after = load(os.path.join(SNAPS, "leak-kept-outputs-step180.pickle"))
    diffs, fits = [], []
    for _ in range(7):
        t = time.perf_counter()
        report = snapdiff.diff(before, after, top=10)
        diffs.append(time.perf_counter() - t)
        msg = protocol.attribution(1, 1.0, report.total_growth_bytes, [s.as_json() for s in report.sites], 1, 2, 1.0)
        t = time.perf_counter()
        attribution.fit_line(msg)
        fits.append(time.perf_counter() - t)
    return statistics.median(diffs) * 1e3, statistics.median(fits) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="a directory holding another gpumon_client package to compare with")
    ap.add_argument("--baseline-ref", help="take the baseline client from this git revision (e.g. HEAD)")
    ap.add_argument("--blocks", type=int, default=15, help="timed blocks per variant, interleaved (default 15)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpm-bench")
    sock = os.path.join(tmp, "ingest.sock")
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "bench_client.py"), "--serve", sock], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        sys.path.insert(0, CLIENT)
        baseline = args.baseline
        if args.baseline_ref:
            baseline = baseline_from_git(args.baseline_ref, tmp)
        variants = []
        if baseline:
            variants.append(("baseline (%s)" % (args.baseline_ref or baseline), Variant("gpumon_client_baseline", baseline, sock, "plain")))
        variants += [
            ("attribution not offered", Variant("gpumon_client", CLIENT, sock, "off")),
            ("offered, no window open", Variant("gpumon_client", CLIENT, sock, "offered")),
            ("a window open", Variant("gpumon_client", CLIENT, sock, "open")),
        ]
        # Interleaved blocks, so a change in machine speed (other processes) biases no variant.
        for _ in range(args.blocks):
            for _name, v in variants:
                v.time_hook(50000)
            for _name, v in variants:
                v.time_samples(500)
        for _name, v in variants:
            v.check()
        print("%d interleaved blocks per variant; min / median" % args.blocks)
        print("%-28s %22s %22s" % ("", "hook ns/step (no sample)", "sample us"))
        for name, v in variants:
            print("%-28s %11.0f / %8.0f %13.1f / %6.1f" % (
                name, min(v.hook_ns), statistics.median(v.hook_ns), min(v.sample_us), statistics.median(v.sample_us)))
        diff_ms, fit_ms = edges()
        print("window edges on the H100 fixture pair: diff %.1f ms, fitting the line %.2f ms" % (diff_ms, fit_ms))
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
