"""Results of gpu-check: one row per check (pass, fail, skip or info, with its figure), printed
as a table and written as markdown for docs/gpu-check.md and as JSON for tools."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

PASS, FAIL, SKIP, INFO = "pass", "fail", "skip", "info"
STATUSES = (PASS, FAIL, SKIP, INFO)


class Check:
    def __init__(self, name: str, status: str, figure: str, detail: str = "") -> None:
        if status not in STATUSES:
            raise ValueError("unknown status %r for check %r" % (status, name))
        self.name = name
        self.status = status
        self.figure = figure
        self.detail = detail

    @classmethod
    def verdict(cls, name: str, ok: bool, figure: str, detail: str = "") -> "Check":
        return cls(name, PASS if ok else FAIL, figure, detail)

    def as_dict(self) -> Dict[str, str]:
        return {"name": self.name, "status": self.status, "figure": self.figure, "detail": self.detail}


def failed(checks: Sequence[Check]) -> List[Check]:
    return [c for c in checks if c.status == FAIL]


def exit_status(checks: Sequence[Check]) -> int:
    """0 when nothing failed; 1 when a check failed (or none ran at all)."""
    return 1 if failed(checks) or not checks else 0


def table(checks: Sequence[Check], width: int = 100) -> str:
    """Plain-text table for the terminal; long figures wrap under their own column."""
    name_w = max([len("CHECK")] + [len(c.name) for c in checks])
    status_w = 6
    fig_w = max(30, width - name_w - status_w - 4)
    lines = ["%-*s  %-*s  %s" % (name_w, "CHECK", status_w, "RESULT", "FIGURE")]
    for c in checks:
        chunks = _wrap(c.figure, fig_w) or [""]
        lines.append("%-*s  %-*s  %s" % (name_w, c.name, status_w, c.status.upper(), chunks[0]))
        for chunk in chunks[1:]:
            lines.append("%s  %s" % (" " * (name_w + status_w + 2), chunk))
    n = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    lines.append("")
    lines.append("%d passed, %d failed, %d skipped, %d measurements" % (n[PASS], n[FAIL], n[SKIP], n[INFO]))
    return "\n".join(lines)


def _wrap(text: str, width: int) -> List[str]:
    words, out, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            out.append(cur)
            cur = w
        else:
            cur = "%s %s" % (cur, w) if cur else w
    if cur:
        out.append(cur)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(checks: Sequence[Check], context: Dict[str, Any], notes: Optional[Sequence[str]] = None) -> str:
    """The results section as it goes into docs/gpu-check.md."""
    out = ["### Run of %s" % context.get("date", "?"), ""]
    for key in ("host", "gpu", "driver", "torch", "python", "gpumon", "mode", "duration"):
        if context.get(key):
            out.append("- %s: %s" % (key, context[key]))
    out += ["", "| check | result | figure |", "|---|---|---|"]
    for c in checks:
        out.append("| %s | %s | %s |" % (_cell(c.name), c.status, _cell(c.figure)))
    details = [c for c in checks if c.detail]
    if details or notes:
        out.append("")
    for c in details:
        out.append("- %s: %s" % (c.name, _cell(c.detail)))
    for n in notes or []:
        out.append("- %s" % _cell(n))
    return "\n".join(out) + "\n"


def as_json(checks: Sequence[Check], context: Dict[str, Any], extra: Dict[str, Any]) -> str:
    return json.dumps(
        {"context": context, "checks": [c.as_dict() for c in checks], "measurements": extra},
        indent=1,
        sort_keys=True,
        default=str,
    )
