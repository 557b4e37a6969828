#!/usr/bin/env python3
"""Scores `gpumon analyze --format json` against the corpus labels.

    gpumon analyze --format json OUT/*.jsonl > findings.json
    python3 corpus/evaluate.py OUT/labels.json findings.json      # '-' reads stdin

Prints a markdown table (one row per labelled trace) and exits 0 when every criterion holds,
1 when any fails, 2 when an input cannot be read. The criteria (README.md has the formulas):
  - every kind in a trace's `expect` is raised, no kind in its `forbid` is;
  - a leak's first finding comes after the leak began and before the floor grew
    max(2 GiB, 3% of device_total) past its value at onset; the same for untracked_growth and
    the memory outside the allocator;
  - where the label knows when memory runs out (`oom_step`), the forecast made at detection,
    first_step + oom_eta_steps, is within 35% of the steps that really remained;
  - a creeping cache's first cache_growth finding comes after the creep began, and its forecast
    is within 35% of the steps left until reserved reaches the limit (`cache_full_step`).
"""

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import floor_model as fm  # noqa: E402
import summary  # noqa: E402

FORECAST_TOLERANCE = 0.35


class InputError(Exception):
    pass


def load_json(path: str, what: str) -> Any:
    try:
        if path == "-":
            return json.load(sys.stdin)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise InputError("cannot read %s %s: %s" % (what, path, exc.strerror))
    except ValueError as exc:
        raise InputError("%s %s is not JSON: %s" % (what, path, exc))


def index_findings(doc: Any, source: str) -> Dict[str, List[Dict[str, Any]]]:
    """file basename -> findings, from analyze's {"traces": [{"file", "findings": [...]}, ...]}."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traces"), list):
        raise InputError('%s: expected an object with a "traces" list (gpumon analyze --format json)' % source)
    out: Dict[str, List[Dict[str, Any]]] = {}
    for i, trace in enumerate(doc["traces"]):
        if not isinstance(trace, dict) or not isinstance(trace.get("file"), str):
            raise InputError('%s: traces[%d] has no "file" string' % (source, i))
        findings = trace.get("findings", [])
        if not isinstance(findings, list) or not all(isinstance(f, dict) and isinstance(f.get("kind"), str) for f in findings):
            raise InputError('%s: traces[%d] ("%s") findings must be objects with a "kind"' % (source, i, trace["file"]))
        key = os.path.basename(trace["file"])
        if key in out:
            raise InputError("%s: trace %s appears twice" % (source, key))
        out[key] = findings
    return out


def check_labels(doc: Any, source: str) -> List[Dict[str, Any]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("traces"), list):
        raise InputError('%s: expected an object with a "traces" list (labels.json from corpus/generate.py)' % source)
    for lab in doc["traces"]:
        model = lab.get("floor_model")
        if "leak" in lab.get("expect", []):
            if model is None or lab.get("leak_onset_step") is None:
                raise InputError("%s: leak trace %s has no floor_model/leak_onset_step" % (source, lab.get("file")))
            if fm.floor_bytes(model, lab["leak_onset_step"]) != lab["floor_at_onset_bytes"]:
                raise InputError("%s: %s floor_at_onset_bytes disagrees with its floor_model" % (source, lab["file"]))
    return doc["traces"]


def gib(n: float) -> str:
    return "%.2f GiB" % (n / fm.GIB)


def forecast_error(first_step: int, eta_steps: float, oom_step: int) -> float:
    """|predicted OOM step - real OOM step| / steps that really remained at detection."""
    return abs(first_step + eta_steps - oom_step) / float(oom_step - first_step)


def judge(
    lab: Dict[str, Any], findings: Optional[List[Dict[str, Any]]], forecast_exempt: bool = False
) -> Tuple[List[str], Dict[str, str]]:
    """(failures, table cells) for one labelled trace. With `forecast_exempt`, a forecast outside
    the tolerance is shown as a known limit instead of a failure."""
    cells = {"got": "", "first": "", "growth": "", "forecast": ""}
    if findings is None:
        return ["not in the analyze output"], cells
    kinds = sorted({f["kind"] for f in findings})
    cells["got"] = ", ".join(kinds) or "-"
    failures = ["missed %s" % k for k in lab["expect"] if k not in kinds]
    failures += ["false %s" % k for k in lab["forbid"] if k in kinds]
    outside = [f for f in findings if f["kind"] == "untracked_growth" and isinstance(f.get("first_step"), int)]
    if "untracked_growth" in lab["expect"] and outside and lab.get("outside_growth"):
        # Growth outside the allocator is judged as a leak is: after it began, within the budget.
        g = lab["outside_growth"]
        step = min(f["first_step"] for f in outside)
        grown = max(0, step - g["onset_step"]) * g["bytes_per_step"]
        budget = fm.growth_budget(lab["device_total"])
        cells["first"] = str(step)
        cells["growth"] = "%s (%d%%)" % (gib(grown), round(100.0 * grown / budget))
        if step <= g["onset_step"]:
            failures.append("untracked_growth flagged at step %d, before it began (step %d)" % (step, g["onset_step"]))
        elif grown > budget:
            failures.append("late: outside grew %s past onset, budget %s" % (gib(grown), gib(budget)))
    failures += judge_cache(lab, findings, cells)
    leaks = [f for f in findings if f["kind"] == "leak"]
    if "leak" not in lab["expect"] or not leaks:
        return failures, cells
    if not all(isinstance(f.get("first_step"), int) for f in leaks):
        return failures + ["leak finding without an integer first_step"], cells
    first = min(leaks, key=lambda f: f["first_step"])
    step = first["first_step"]
    onset = lab["leak_onset_step"]
    cells["first"] = str(step)
    if step <= onset:
        failures.append("leak flagged at step %d, before it began (step %d)" % (step, onset))
        return failures, cells
    model = lab["floor_model"]
    growth = fm.growth_at(model, step)
    budget = fm.growth_budget(lab["device_total"])
    cells["growth"] = "%s (%d%%)" % (gib(growth), round(100.0 * growth / budget))
    if growth > budget:
        failures.append("late: floor grew %s past onset, budget %s" % (gib(growth), gib(budget)))
    oom_step = lab.get("oom_step")
    if oom_step is not None:
        eta = first.get("oom_eta_steps")
        if step >= oom_step:
            failures.append("flagged at step %d, not before the OOM at step %d" % (step, oom_step))
        elif not isinstance(eta, (int, float)) or isinstance(eta, bool):
            cells["forecast"] = "none"
            failures.append("no oom_eta_steps (memory runs out at step %d)" % oom_step)
        else:
            err = forecast_error(step, eta, oom_step)
            signed = (step + eta - oom_step) / float(oom_step - step)
            cells["forecast"] = "%+.0f%%" % (100.0 * signed)
            if err > FORECAST_TOLERANCE and forecast_exempt:
                cells["forecast"] += " (known limit)"
            elif err > FORECAST_TOLERANCE:
                failures.append(
                    "forecast step %d vs real %d: off by %.0f%% of the %d steps left"
                    % (step + eta, oom_step, 100.0 * err, oom_step - step)
                )
    return failures, cells


def judge_cache(lab: Dict[str, Any], findings: List[Dict[str, Any]], cells: Dict[str, str]) -> List[str]:
    """A creeping cache: flagged after it began, with a forecast of when reserved is full."""
    mine = [f for f in findings if f["kind"] == "cache_growth" and isinstance(f.get("first_step"), int)]
    g, full = lab.get("cache_growth"), lab.get("cache_full_step")
    if "cache_growth" not in lab["expect"] or not mine or not g or full is None:
        return []
    first = min(mine, key=lambda f: f["first_step"])
    step = first["first_step"]
    cells["first"] = str(step)
    cells["growth"] = "%s reserved" % gib(max(0, step - g["onset_step"]) * g["bytes_per_step"])
    if step <= g["onset_step"]:
        return ["cache_growth flagged at step %d, before it began (step %d)" % (step, g["onset_step"])]
    eta = first.get("oom_eta_steps")
    if not isinstance(eta, (int, float)) or isinstance(eta, bool):
        cells["forecast"] = "none"
        return ["cache_growth without oom_eta_steps (reserved is full at step %d)" % full]
    signed = (step + eta - full) / float(full - step)
    cells["forecast"] = "%+.0f%%" % (100.0 * signed)
    if abs(signed) > FORECAST_TOLERANCE:
        return ["cache_growth forecast step %d vs real %d: off by %.0f%%" % (step + eta, full, 100.0 * abs(signed))]
    return []


def evaluate(
    labels: List[Dict[str, Any]],
    found: Dict[str, List[Dict[str, Any]]],
    forecast_exempt: Tuple[str, ...] = (),
) -> Tuple[List[str], int]:
    """(markdown lines, number of failing traces)."""
    lines = [
        "| file | shape | expected | got | first step | growth at detection | forecast error | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    failed = 0
    for lab in labels:
        failures, cells = judge(lab, found.get(lab["file"]), lab["shape"] in forecast_exempt)
        failed += bool(failures)
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                lab["file"],
                lab["shape"],
                ", ".join(lab["expect"]) or "-",
                cells["got"],
                cells["first"],
                cells["growth"],
                cells["forecast"],
                "FAIL: " + "; ".join(failures) if failures else "pass",
            )
        )
    return lines, failed


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Score gpumon analyze JSON against corpus labels.")
    ap.add_argument("labels", help="labels.json written by corpus/generate.py")
    ap.add_argument("analyze", help="output of `gpumon analyze --format json TRACE...` ('-' for stdin)")
    ap.add_argument(
        "--known-forecast-limit",
        action="append",
        default=[],
        metavar="SHAPE",
        help="report this shape's forecast error without failing on it (a linear forecast cannot "
        "foresee a leak that accelerates later)",
    )
    args = ap.parse_args(argv)
    try:
        labels = check_labels(load_json(args.labels, "labels"), args.labels)
        found = index_findings(load_json(args.analyze, "analyze output"), args.analyze)
    except InputError as exc:
        print("evaluate: %s" % exc, file=sys.stderr)
        return 2
    lines, failed = evaluate(labels, found, tuple(args.known_forecast_limit))
    print("\n".join(lines))
    leaks = [lab for lab in labels if "leak" in lab["expect"]]
    print()
    print(
        "%d traces, %d failed (%d leak traces, %d healthy); forecast tolerance %.0f%%"
        % (len(labels), failed, len(leaks), len(labels) - len(leaks), 100 * FORECAST_TOLERANCE)
    )
    print()
    print("\n".join(summary.table(summary.per_kind(labels, found))))
    extra = sorted(set(found) - {lab["file"] for lab in labels})
    if extra:
        print("ignored %d analyzed traces without a label: %s" % (len(extra), ", ".join(extra)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
