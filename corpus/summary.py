"""Per-detector scores over a labelled corpus: precision, recall, and how long detection took.

A finding of a kind counts as caught on a trace that expects it, as a false positive on any other
trace (forbidden or merely not expected, like `fragmentation`, which no trace expects). Time and
steps to detect run from when the condition really began, which the label's `truth` records
(leak: the last step at the pre-leak floor; near_limit: the first allocator retry; oom: the
first OOM; untracked_growth: the last step before memory outside the allocator began to grow;
cache_growth: the last step before the cache began to creep), to the finding's `first_step` / `first_ts`; a near_limit raised on headroom before
the first retry counts negative.
"""

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

import floor_model as fm

KINDS = ("leak", "near_limit", "fragmentation", "oom", "crash", "untracked_growth", "cache_growth")


def per_kind(labels: Sequence[Mapping[str, Any]], found: Mapping[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for kind in KINDS:
        row: Dict[str, Any] = {"expected": 0, "caught": 0, "missed": 0, "false": 0, "forbidden": 0, "steps": [], "seconds": [], "budget": []}
        for lab in labels:
            mine = [f for f in found.get(lab["file"], []) if f.get("kind") == kind]
            if kind not in lab["expect"]:
                row["false"] += bool(mine)
                row["forbidden"] += bool(mine) and kind in lab["forbid"]
                continue
            row["expected"] += 1
            if not mine:
                row["missed"] += 1
                continue
            row["caught"] += 1
            ref = lab.get("truth", {}).get(kind)
            steps = [f["first_step"] for f in mine if isinstance(f.get("first_step"), int)]
            times = [f["first_ts"] for f in mine if isinstance(f.get("first_ts"), (int, float))]
            if ref and steps:
                row["steps"].append(min(steps) - ref["step"])
            if kind == "leak" and steps and lab.get("floor_model"):
                # How much of the growth budget the leak had used when it was flagged.
                row["budget"].append(100.0 * fm.growth_at(lab["floor_model"], min(steps)) / fm.growth_budget(lab["device_total"]))
            if ref and times:
                row["seconds"].append(min(times) - ref["ts"])
        caught, false = row["caught"], row["false"]
        row["precision"] = caught / (caught + false) if caught + false else None
        row["recall"] = caught / row["expected"] if row["expected"] else None
        out[kind] = row
    return out


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else "%.2f" % x


def _spread(xs: List[float], fmt: str) -> str:
    if not xs:
        return "-"
    return (fmt + " / " + fmt) % (statistics.median(xs), max(xs))


def _timing(r: Mapping[str, Any]) -> str:
    return "%s | %s | %s" % (_spread(r["steps"], "%.0f"), _spread(r["seconds"], "%.0f"), _spread(r["budget"], "%.0f%%"))


def table(scores: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """Markdown: one row per detector."""
    lines = [
        "| detector | expected | caught | missed | false (forbidden) | precision | recall | steps to detect, median / max | seconds to detect, median / max | leak budget used, median / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in scores.items():
        lines.append(
            "| %s | %d | %d | %d | %d (%d) | %s | %s | %s |"
            % (kind, r["expected"], r["caught"], r["missed"], r["false"], r["forbidden"], _ratio(r["precision"]), _ratio(r["recall"]), _timing(r))
        )
    return lines


def compare(by_cadence: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> List[str]:
    """Markdown: one row per detector and cadence, so the cadences sit next to each other."""
    lines = [
        "| detector | cadence | expected | caught | false (forbidden) | precision | recall | steps to detect, median / max | seconds to detect, median / max | leak budget used, median / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for cadence, scores in by_cadence.items():
            r = scores[kind]
            lines.append(
                "| %s | %s | %d | %d | %d (%d) | %s | %s | %s |"
                % (kind, cadence, r["expected"], r["caught"], r["false"], r["forbidden"], _ratio(r["precision"]), _ratio(r["recall"]), _timing(r))
            )
    return lines
