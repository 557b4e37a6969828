"""The analyses' results as text for people: `diff`'s report, `explain`'s explanation, the line
that describes a trimmed file. Paths and names come from the pickle, so every line is escaped
(control characters never reach the terminal raw)."""

from typing import Dict, List

from .diff import Report
from .explain import Explanation
from .units import fmt_bytes, fmt_limit

__all__ = ["diff_text", "explanation_text", "trimmed_text", "wrap", "printable"]


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _lines(lines: List[str]) -> str:
    return "\n".join(printable(line) for line in lines) + "\n"


def wrap(text: str, width: int, indent: str) -> List[str]:
    out, cur = [], ""
    for w in text.split():
        if cur and len(indent) + len(cur) + 1 + len(w) > width:
            out.append(indent + cur)
            cur = w
        else:
            cur = "%s %s" % (cur, w) if cur else w
    if cur:
        out.append(indent + cur)
    return out


def diff_text(report: Report, before: str = "BEFORE", after: str = "AFTER", *, min_bytes: int = 1 << 20,
              frames: int = 4, width: int = 100) -> str:
    """The report for people, at most `width` columns except for long paths."""
    b_live, a_live = report.live_bytes
    change = a_live - b_live
    how = "did not change" if change == 0 else "%s by %s" % ("grew" if change > 0 else "shrank", fmt_bytes(abs(change)))
    lines = ["live memory %s (%s -> %s)" % (how, fmt_bytes(b_live), fmt_bytes(a_live)),
             "  from %s" % before, "  to   %s" % after]
    if not report.stacks_recorded:
        lines.append("%s has no allocation stacks: record them before taking snapshots, with "
                     "torch.cuda.memory._record_memory_history(max_entries=100000)" % after)
    if report.no_stack_bytes:
        lines.append("%s in %d more live blocks without a stack (allocated while history was not recorded)"
                     % (fmt_bytes(report.no_stack_bytes), report.no_stack_blocks))
    if not report.sites:
        lines.append("no allocation site grew by %s or more" % fmt_bytes(min_bytes))
        return _lines(lines)
    denom = max(report.total_growth_bytes, sum(s.bytes for s in report.sites)) or 1
    lines += ["", "%10s  %7s  %5s  %s" % ("grew", "blocks", "share", "allocated at")]
    for s in report.sites:
        lines.append("%10s  %7s  %4.0f%%  %s in %s" % (
            fmt_bytes(s.bytes), "+%d" % s.blocks, 100.0 * s.bytes / denom, s.short(), s.function))
        pad = " " * 6
        if s.note:
            lines += wrap("note: " + s.note, width, pad)
        for i, f in enumerate(s.stack[:frames]):
            lines.append("%s%s %s:%d in %s" % (pad, "at" if i == 0 else "  ", f["file"], f["line"], f["function"]))
        if len(s.stack) > frames:
            lines.append("%s   ... %d more frames" % (pad, len(s.stack) - frames))
    return _lines(lines)


def explanation_text(ex: Explanation, name: str = "SNAPSHOT", *, frames: int = 4, width: int = 100) -> str:
    lines = wrap(ex.message, width, "")
    lines.append("  in %s" % name)
    nums = []
    if ex.request_bytes is not None:
        nums.append("asked %s" % fmt_bytes(ex.request_bytes))
    if ex.limit_bytes is not None:
        nums.append("allowed %s" % fmt_limit(ex.limit_bytes))
    if ex.allocated_bytes is not None:
        nums.append("live %s" % fmt_bytes(ex.allocated_bytes))
    if ex.reserved_bytes is not None:
        nums.append("reserved %s (%s free, largest free block %s)" % (
            fmt_bytes(ex.reserved_bytes), fmt_bytes(ex.reserved_free_bytes or 0), fmt_bytes(ex.largest_free_block_bytes or 0)))
    if nums:
        lines += wrap(", ".join(nums), width, "  ")
    for r in ex.reasons:
        lines += wrap("why: " + r, width, "  ")
    if ex.failing_site:
        lines.append("")
        lines.append("the line that asked:")
        for i, f in enumerate(ex.failing_site["stack"][:frames]):
            lines.append("  %s %s:%d in %s" % ("at" if i == 0 else "  ", f["file"], f["line"], f["function"]))
    for i, r in enumerate(ex.remedies):
        lines += wrap(("remedy: " if i == 0 else "or: ") + r, width, "  ")
    if ex.live_sites:
        live = max(ex.allocated_bytes or 0, sum(s.bytes for s in ex.live_sites)) or 1
        lines += ["", "%10s  %7s  %5s  %s" % ("live", "blocks", "share", "allocated at")]
        for s in ex.live_sites:
            lines.append("%10s  %7d  %4.0f%%  %s in %s" % (fmt_bytes(s.bytes), s.blocks, 100.0 * s.bytes / live, s.short(), s.function))
            for i, f in enumerate(s.stack[:frames]):
                lines.append("      %s %s:%d in %s" % ("at" if i == 0 else "  ", f["file"], f["line"], f["function"]))
            if len(s.stack) > frames:
                lines.append("         ... %d more frames" % (len(s.stack) - frames))
    return _lines(lines)


def trimmed_text(path: str, info: Dict[str, int]) -> str:
    """The line that says what `trim.write` wrote (trim.trim's info and the file's bytes)."""
    return printable("trimmed snapshot: %s, %s (%d segments, %d blocks, %d of %d history entries); open it at "
                     "https://pytorch.org/memory_viz" % (path, fmt_bytes(info["bytes"]), info["segments"], info["blocks"],
                                                        info["entries"], info["of_entries"]))
