#!/usr/bin/env python3
"""Per-step cost of the client beyond torch.cuda.memory_stats() itself.

Runs the real per-step path (the optimizer hook's dedup logic, sample building, the transport)
with a stats source that returns a realistic memory_stats() dict, and subtracts the cost of
calling that source alone. Two cases: a live server in another process (it reads and discards,
like a healthy daemon) and no daemon at all. Targets: <= 20 us live, <= 5 us down.

    python3 clients/python/bench/bench_client.py [--steps N] [--repeats R]
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gpumon_client import Client, StaticStatsSource  # noqa: E402
from gpumon_client.hooks import Attachment  # noqa: E402


def memory_stats_like():
    """The shape of torch.cuda.memory_stats() on torch 2.x: ~120 flat keys."""
    stats = {}
    for metric in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                   "requested_bytes", "allocation", "segment", "active", "inactive_split"):
        for pool in ("all", "large_pool", "small_pool"):
            for stat in ("current", "peak", "allocated", "freed"):
                stats["%s.%s.%s" % (metric, pool, stat)] = 21474836480
    for name in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free", "max_split_size", "oversize_allocations.current",
                 "oversize_allocations.peak", "oversize_segments.current", "oversize_segments.peak"):
        stats[name] = 3
    return stats


class Source(StaticStatsSource):
    # torch builds a fresh dict on every call; so does this, so the subtraction is fair.
    def memory_stats(self):
        return dict(self.stats)


def serve(path):
    """A daemon stand-in in its own process: accept, read, discard."""
    import threading

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)

    def drain(conn):
        while conn.recv(1 << 20):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


class Optimizer:
    pass


def per_step_us(fn, steps):
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps * 1e6


def measure(path, steps, repeats, stats_keys="known"):
    source = Source(memory_stats_like(), (47244640256, 85520809984),
                    {"cuda_device": 0, "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000"})
    kwargs = {} if stats_keys == "known" else {"stats_keys": None}
    client = Client("bench", source=source, socket=path, **kwargs)
    hook = Attachment(client)
    opt = Optimizer()

    def baseline():
        source.memory_stats()
        source.mem_get_info()

    def step():
        hook.on_optimizer_step(opt)

    per_step_us(step, steps // 10)  # warm up: connect, caches
    costs = []
    for _ in range(repeats):
        base = per_step_us(baseline, steps)
        full = per_step_us(step, steps)
        costs.append(full - base)
    st = client.stats()
    client.close(timeout=1.0)
    return statistics.median(costs), min(costs), base, st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0

    tmp = tempfile.mkdtemp(prefix="gpmbench")
    path = os.path.join(tmp, "ingest.sock")
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", path],
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        print("python %s, %d steps x %d repeats; cost = per-step time minus memory_stats()+mem_get_info()"
              % (sys.version.split()[0], args.steps, args.repeats))
        rows = [
            ("live server, known keys", path, "known", 20.0),
            ("live server, all ~120 keys", path, "all", None),
            ("daemon down", os.path.join(tmp, "absent.sock"), "known", 5.0),
        ]
        failed = False
        for label, p, keys, target in rows:
            median, best, base, st = measure(p, args.steps, args.repeats, keys)
            verdict = "" if target is None else ("  (target <= %.0f us: %s)" % (target, "ok" if median <= target else "MISSED"))
            failed |= target is not None and median > target
            print("%-28s %6.2f us/step median, %6.2f best; memory_stats() alone %.2f us; sent %d, dropped %d%s"
                  % (label, median, best, base, st["sent_lines"], st["dropped"], verdict))
        return 1 if failed else 0
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
