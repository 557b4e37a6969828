#!/usr/bin/env python3
"""gpumon's explain and diff beside torch's own memory_viz tools, on one large snapshot.

    python3 clients/python/bench/bench_snapshot_reader.py [--file SNAPSHOT.pickle]
        [--entries 1000000] [--segments 100000] [--depth 360] [--torch-python PYTHON]
        [--tools explain,explain-trimmed,diff,stats,trace,segments,trace_plot] [--json OUT]

Without --file, bench/gen_snapshot.py writes one first (under $TMPDIR). Each command then runs as
a child process, one after the other, and is measured by wait4(): wall time, CPU time (user +
system: the figure to compare when other work shares the machine) and peak RSS.

- gpumon: `explain` (reads what it needs, streamed), `explain --write-trimmed` (keeps every
  field, writes the trimmed file), `diff SNAP SNAP` (the file twice: two reads);
- torch (`python -m torch.cuda._memory_viz`, the installed torch's command line): `stats`,
  `trace` (printed to /dev/null), `segments` and `compare` (their flame graph script,
  ~/.cache/flamegraph.pl, is replaced by `wc -l`: nothing is downloaded, the lines it gets are
  counted), `trace_plot` (the HTML the browser loads: the whole snapshot, pickled and base64'd).
  Then torch's `stats` and `trace` on the trimmed file.

Each command gets --timeout seconds (600 by default): torch's `trace` looks each allocation's
segment up by a linear scan of all segments, so it does not finish on 1M entries and 100k segments.
Torch's tools run under an address-space limit (--torch-limit-gib, 16 by default), so that one
that needs more fails alone instead of making the machine swap or kill; then its row says so.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.dirname(HERE)
TORCH_TOOLS = ("stats", "trace", "segments", "trace_plot")
# `compare` is left out by default: its command line hands the whole dict to a function that
# iterates segments, and fails on every snapshot torch writes now (TypeError), whatever the size.
GPUMON_TOOLS = ("explain", "explain-trimmed", "diff")


def torch_python() -> Optional[str]:
    base = os.path.expanduser("~/.cache/gpumon/venvs")
    if os.path.isdir(base):
        for name in sorted(os.listdir(base)):
            if name.startswith("torch-newest"):
                return os.path.join(base, name, "bin", "python")
    return None


def run(cmd: List[str], *, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
        limit_bytes: Optional[int] = None, timeout: float = 600) -> Dict[str, Any]:
    """Runs cmd (stdout to /dev/null); wall, CPU and peak RSS of that child alone (wait4)."""
    def limit() -> None:
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=null, stderr=err, env=env, cwd=cwd, preexec_fn=limit)
        deadline = t0 + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        err.seek(0)
        tail = err.read().decode("utf-8", "replace").strip().splitlines()[-1:]
    code = os.waitstatus_to_exitcode(status)
    if wall > timeout:
        tail = ["did not finish in %d s (killed)" % timeout]
    return {"cmd": " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)), "rc": code,
            "wall_s": round(wall, 1), "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
            "peak_rss_mib": round(ru.ru_maxrss / 1024), "error": tail[0][:200] if code and tail else ""}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file")
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--segments", type=int, default=100_000)
    p.add_argument("--depth", type=int, default=360)
    p.add_argument("--torch-python", default=torch_python())
    p.add_argument("--torch-limit-gib", type=float, default=16.0)
    p.add_argument("--tools", default=",".join(GPUMON_TOOLS + TORCH_TOOLS))
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a command may run")
    p.add_argument("--json")
    a = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="gpumon-bench-")
    try:
        snap = a.file
        if snap is None:
            snap = os.path.join(work, "snapshot.pickle")
            gen = run([sys.executable, os.path.join(HERE, "gen_snapshot.py"), snap, "--entries", str(a.entries),
                       "--segments", str(a.segments), "--depth", str(a.depth)])
            print("generated %s: %.2f GB in %.0f s (peak RSS %d MiB)" % (snap, os.path.getsize(snap) / 1e9, gen["wall_s"],
                                                                       gen["peak_rss_mib"]))
        size = os.path.getsize(snap)
        tools = [t for t in a.tools.split(",") if t]
        rows = []
        env = dict(os.environ, PYTHONPATH=CLIENT)
        gpumon = [sys.executable, "-m", "gpumon_client"]
        trimmed = os.path.join(work, "trimmed.pickle")
        for tool in tools:
            if tool == "explain":
                rows.append(("gpumon", tool, run(gpumon + ["explain", snap], env=env, cwd=CLIENT)))
            elif tool == "explain-trimmed":
                rows.append(("gpumon", tool, run(gpumon + ["explain", snap, "--write-trimmed", trimmed], env=env,
                                                 cwd=CLIENT)))
                if os.path.exists(trimmed):
                    rows[-1][2]["trimmed_bytes"] = os.path.getsize(trimmed)
            elif tool == "diff":
                rows.append(("gpumon", tool, run(gpumon + ["diff", snap, snap], env=env, cwd=CLIENT)))
            elif tool in TORCH_TOOLS:
                if not a.torch_python:
                    continue
                home = os.path.join(work, "home")
                os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
                fg = os.path.join(home, ".cache", "flamegraph.pl")
                with open(fg, "w") as f:
                    f.write("#!/bin/sh\nwc -l\n")
                os.chmod(fg, 0o755)
                args = {"stats": [snap], "trace": [snap], "segments": [snap, "-o", os.path.join(work, "seg.svg")],
                        "compare": [snap, snap, "-o", os.path.join(work, "cmp.svg")],
                        "trace_plot": [snap, "-o", os.path.join(work, "plot.html")]}[tool]
                rows.append(("torch", tool, run([a.torch_python, "-m", "torch.cuda._memory_viz", tool] + args,
                                                env=dict(os.environ, HOME=home), cwd=work,
                                                limit_bytes=int(a.torch_limit_gib * (1 << 30)), timeout=a.timeout)))
            print("%-6s %-16s %s" % (rows[-1][0], rows[-1][1], json.dumps(rows[-1][2])), flush=True)
        if os.path.exists(trimmed) and a.torch_python:
            for tool in ("stats", "trace"):
                r = run([a.torch_python, "-m", "torch.cuda._memory_viz", tool, trimmed], cwd=work)
                rows.append(("torch", tool + " (trimmed file)", r))
                print("%-6s %-16s %s" % ("torch", tool + " (trimmed)", json.dumps(r)), flush=True)
        print("\nfile: %s, %.2f GB\n" % (snap, size / 1e9))
        print("| tool | command | wall | CPU | peak RSS | |")
        print("|---|---|---:|---:|---:|---|")
        for who, tool, r in rows:
            note = "exit %d: %s" % (r["rc"], r["error"]) if r["rc"] else ""
            if "trimmed_bytes" in r:
                note = "trimmed file %.1f MB" % (r["trimmed_bytes"] / 1e6)
            print("| %s | %s | %.1f s | %.1f s | %s MiB | %s |" % (who, tool, r["wall_s"], r["cpu_s"],
                                                                format(r["peak_rss_mib"], ","), note))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"file": snap, "bytes": size, "rows": [dict(r, who=w, tool=t) for w, t, r in rows]}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the generated snapshot and the tools' outputs
    return 0


if __name__ == "__main__":
    sys.exit(main())
