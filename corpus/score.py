#!/usr/bin/env python3
"""Scores `gpumon analyze` on the corpus at both sampling cadences and compares them.

    python3 corpus/score.py --gpumon target/debug/gpumon [--out DIR] [--shape NAME ...]
        [--known-forecast-limit SHAPE ...] [--tables]

One simulation per trace, written twice (generate.py --cadence both): `fixed`, a sample every
`sample_every` steps, and `adaptive`, the same run thinned as the Python client's default cadence
would (cadence.py). Each is analyzed and scored by evaluate.py's criteria; prints the traces that
fail, per cadence, and a per-detector comparison (precision, recall, time and steps to detect).
Exit 0 when every trace passes at every cadence, 1 otherwise, 2 when the pipeline cannot run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import evaluate  # noqa: E402
import generate  # noqa: E402
import summary  # noqa: E402
from cadence import CADENCES  # noqa: E402


def analyze(gpumon: str, trace_dir: str) -> Dict[str, Any]:
    traces = sorted(os.path.join(trace_dir, n) for n in os.listdir(trace_dir) if n.endswith(".jsonl"))
    try:
        run = subprocess.run([gpumon, "analyze", "--format", "json"] + traces, capture_output=True)
    except OSError as exc:
        raise evaluate.InputError("cannot run %s: %s" % (gpumon, exc.strerror))
    # Exit 1 means findings were raised, which a corpus with leaks in it must produce.
    if run.returncode not in (0, 1):
        raise evaluate.InputError("%s analyze exited %d: %s" % (gpumon, run.returncode, run.stderr.decode(errors="replace").strip()))
    try:
        return json.loads(run.stdout)
    except ValueError as exc:
        raise evaluate.InputError("%s analyze printed no JSON: %s" % (gpumon, exc))


def score(gpumon: str, root: str, shapes: Sequence[str], forecast_exempt: Tuple[str, ...] = ()) -> Dict[str, Dict[str, Any]]:
    """{cadence: {"lines": table, "failed": n, "scores": per-detector, "seconds": analyze time}}."""
    dirs = {c: os.path.join(root, c) for c in CADENCES}
    generate.write(dirs, shapes)
    out: Dict[str, Dict[str, Any]] = {}
    for cadence, d in dirs.items():
        with open(os.path.join(d, "labels.json"), encoding="utf-8") as f:
            labels = evaluate.check_labels(json.load(f), os.path.join(d, "labels.json"))
        start = time.monotonic()
        found = evaluate.index_findings(analyze(gpumon, d), "%s analyze (%s)" % (gpumon, cadence))
        lines, failed = evaluate.evaluate(labels, found, forecast_exempt)
        out[cadence] = {
            "lines": lines,
            "failed": failed,
            "scores": summary.per_kind(labels, found),
            "seconds": time.monotonic() - start,
        }
    return out


def report(result: Dict[str, Dict[str, Any]], tables: bool) -> List[str]:
    lines: List[str] = []
    for cadence, r in result.items():
        rows = r["lines"] if tables else r["lines"][:2] + [x for x in r["lines"][2:] if "| FAIL: " in x]
        lines += ["", "## %s cadence: %d traces failed (analyze %.1f s)" % (cadence, r["failed"], r["seconds"]), ""]
        lines += rows if len(rows) > 2 else ["all traces pass"]
    lines += ["", "## per detector", ""]
    lines += summary.compare({c: r["scores"] for c, r in result.items()})
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--gpumon", required=True, help="the gpumon binary to score (e.g. target/debug/gpumon)")
    ap.add_argument("--out", help="write the corpora here (OUT/fixed, OUT/adaptive) and keep them; default: a temporary directory")
    ap.add_argument("--shape", action="append", choices=sorted(generate.SHAPES), help="only these shapes (repeatable)")
    ap.add_argument("--known-forecast-limit", action="append", default=[], metavar="SHAPE", help="as in evaluate.py")
    ap.add_argument("--tables", action="store_true", help="print every trace's row, not only the failing ones")
    args = ap.parse_args(argv)
    shapes = args.shape or list(generate.SHAPES)
    with tempfile.TemporaryDirectory(prefix="gpumon-corpus-") as tmp:
        try:
            result = score(args.gpumon, args.out or tmp, shapes, tuple(args.known_forecast_limit))
        except evaluate.InputError as exc:
            print("score: %s" % exc, file=sys.stderr)
            return 2
    print("\n".join(report(result, args.tables)))
    return 1 if any(r["failed"] for r in result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
