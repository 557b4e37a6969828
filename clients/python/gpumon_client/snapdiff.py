"""Which lines of the trainer allocate the memory that grew between two allocator snapshots.

    python -m gpumon_client diff BEFORE.pickle AFTER.pickle [--json] [--top N] [--min-bytes B]

Input: two `torch.cuda.memory._snapshot()` dicts (or the files `_dump_snapshot()` writes, read by
`snapload` without running anything), taken while allocation history was recorded so that live
blocks carry the Python stack that allocated them (frames innermost first).

The rule. Only live blocks count (`state == "active_allocated"`). Each is charged to its *site*:
the innermost frame in the user's code, i.e. a `.py` file (or an `<ipython-input...>` cell) that
is not under site-packages or dist-packages, not in a `/torch/` directory, not in gpumon_client,
not the Python standard library (`.../lib/pythonX.Y/...`), not generated code (`<frozen ...>`,
`<string>`, `<eval_with_key>` of torch.fx, torchinductor's output). When no frame qualifies the
site is the innermost Python frame (else the innermost frame). The site's stack is its frame and
the user frames outward from it (all Python frames for a fallback site). Per site, both snapshots
give a number of live blocks and their bytes; a site *grew* when its number of live blocks grew
and its bytes grew by at least `min_bytes`; its growth is the difference in bytes and in blocks.

Why count blocks: a trainer whose batch size varies replaces its live tensors by bigger or smaller
ones from step to step (one block before, one larger block after); that is not a leak, and a rule
on bytes alone would call it one. Memory that is kept adds blocks: one per kept tensor, per step.

Limits of a diff of two snapshots:
- A single tensor that keeps growing while staying one tensor (`acc = torch.cat([acc, out])`) is
  not reported: it looks exactly like a tensor replaced by a bigger batch.
- A site whose number of live blocks follows the batch (one tensor per sample, variable-length
  lists) reads as growth when AFTER's batch has more of them; its growth is then about one batch.
- Blocks allocated before history was recorded have no stack; growth among them is counted apart
  (`Report.no_stack_bytes`) and not attributed.
- Expandable segments and other allocator settings do not change the rule: it counts what the
  allocator reports as live blocks.

Notes: two sites that grow in step (block counts in a whole ratio, e.g. 96 and 24) are likely kept
alive by one thing: an output kept with its autograd graph holds the tensors the graph saved, and
a slice or view (`x[:32]`) holds its whole base tensor. When one site's function calls, after
allocating, into the other's stack, the note says which one likely holds the other. These are
hints, phrased as such.
"""

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .snapload import DEFAULT_BUDGET, SnapshotError, load, loads, validate

__all__ = ["SnapshotError", "load", "loads", "diff", "fit", "Site", "Report", "render", "main"]

# The protocol's limits (docs/protocol.md, the attribution message).
MAX_SITES = 20
MAX_STACK = 32
MAX_STR = 512

Frame = Tuple[str, int, str]  # (file, line, function)


@dataclass
class Site:
    file: str
    line: int
    function: str
    bytes: int
    blocks: int
    stack: List[Dict[str, Any]]  # {"file", "line", "function"} dicts, innermost first; stack[0] is the site
    note: Optional[str] = None

    def as_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "bytes": self.bytes,
            "blocks": self.blocks,
            "stack": [dict(f) for f in self.stack],
        }
        if self.note:
            d["note"] = self.note
        return d

    def short(self) -> str:
        """`train.py:27`, as the daemon names a site."""
        return "%s:%d" % (_basename(self.file), self.line)


@dataclass
class Report:
    total_growth_bytes: int  # growth of all live memory (0 when it shrank)
    sites: List[Site]  # largest first
    # Growth among live blocks that carry no stack (allocated while history was not recorded),
    # by the same rule as a site; 0 when there was none.
    no_stack_bytes: int = 0
    no_stack_blocks: int = 0
    # Whether any live block in AFTER carries a stack (False: history was not recorded).
    stacks_recorded: bool = True
    live_bytes: Tuple[int, int] = field(default=(0, 0))  # before, after

    def as_json(self) -> Dict[str, Any]:
        return {"sites": [s.as_json() for s in self.sites], "total_growth_bytes": self.total_growth_bytes}

    def grew(self) -> bool:
        """Whether growth was found (attributed to a site, or among blocks with no stack)."""
        return bool(self.sites) or self.no_stack_bytes > 0


# --- which frame is the user's -------------------------------------------------------------------

_STDLIB = re.compile(r"/lib/python\d[\d.]*t?/")
_GENERATED = ("<frozen", "<string>", "<eval_with_key>", "<built-in")


@lru_cache(maxsize=4096)
def _is_python(filename: str) -> bool:
    return filename.endswith(".py") or filename.startswith("<")


@lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's code (see the module docstring)."""
    f = filename.replace("\\", "/")
    if f.startswith("<"):
        return not f.startswith(_GENERATED)
    if not f.endswith(".py"):
        return False  # a native (C++) frame
    if "/site-packages/" in f or "/dist-packages/" in f or "/torch/" in f or "/gpumon_client/" in f:
        return False
    if "/torchinductor_" in f:
        return False  # code torch.compile generated
    return not _STDLIB.search(f)


def _frame(f: Any) -> Frame:
    # Lenient: a malformed frame reads as unknown rather than failing the whole diff.
    if not isinstance(f, dict):
        return ("?", 0, "?")
    file, line, name = f.get("filename"), f.get("line"), f.get("name")
    return (
        file if isinstance(file, str) else "?",
        line if isinstance(line, int) and not isinstance(line, bool) else 0,
        name if isinstance(name, str) else "?",
    )


def _block_frames(block: Dict[str, Any]) -> Any:
    frames = block.get("frames")
    if frames is None:
        # torch 2.0's format: the allocation's frames under history[0].
        history = block.get("history")
        if isinstance(history, list) and history and isinstance(history[0], dict):
            frames = history[0].get("frames")
    return frames if isinstance(frames, list) else None


_USER: Dict[Any, bool] = {}  # filename -> is_user_file, for the per-frame loop below


def _user(f: Any) -> bool:
    try:
        return _USER[f["filename"]]
    except KeyError:
        pass
    except TypeError:  # not a dict, or an unhashable filename
        return False
    name = f.get("filename")
    user = isinstance(name, str) and is_user_file(name)
    if len(_USER) < 65536:
        _USER[name] = user
    return user


def _site_stack(raw: Sequence[Any]) -> Tuple[Frame, ...]:
    """The site's stack from a block's raw frames: the site's frame first, then the frames
    outward that are kept. Library frames are only looked at, not copied (they are most)."""
    for i, f in enumerate(raw):
        if _user(f):
            return tuple(_frame(g) for g in raw[i:] if _user(g))
    frames = [_frame(f) for f in raw]
    for i, f in enumerate(frames):
        if _is_python(f[0]):
            return tuple(g for g in frames[i:] if _is_python(g[0]))
    return tuple(frames)


# --- tallies and the diff ------------------------------------------------------------------------


class _Tally:
    __slots__ = ("blocks", "bytes", "stacks")

    def __init__(self) -> None:
        self.blocks = 0
        self.bytes = 0
        self.stacks: "Counter[Tuple[Frame, ...]]" = Counter()


def _tally(snapshot: Dict[str, Any]) -> Tuple[Dict[Frame, _Tally], _Tally, int, bool]:
    """Live blocks per site, the live blocks without a stack, all live bytes, whether any live
    block has a stack."""
    sites: Dict[Frame, _Tally] = {}
    none = _Tally()
    total = 0
    cache: Dict[int, Tuple[Frame, ...]] = {}  # frames lists are often shared between blocks
    for seg in snapshot["segments"]:
        for b in seg.get("blocks", ()):
            if b["state"] != "active_allocated":
                continue
            size = b["size"]
            total += size
            raw = _block_frames(b)
            if not raw:
                none.blocks += 1
                none.bytes += size
                continue
            stack = cache.get(id(raw))
            if stack is None:
                stack = _site_stack(raw)
                cache[id(raw)] = stack
            t = sites.get(stack[0])
            if t is None:
                t = sites[stack[0]] = _Tally()
            t.blocks += 1
            t.bytes += size
            t.stacks[stack] += 1
    return sites, none, total, bool(sites)


def _grew(after: _Tally, before: Optional[_Tally], min_bytes: int) -> Tuple[int, int]:
    """(bytes, blocks) grown, or (0, 0) when the rule says it did not grow."""
    dn = after.blocks - (before.blocks if before else 0)
    db = after.bytes - (before.bytes if before else 0)
    if dn > 0 and db > 0 and db >= min_bytes:
        return db, dn
    return 0, 0


def diff(before: Dict[str, Any], after: Dict[str, Any], *, top: int = 10, min_bytes: int = 1 << 20) -> Report:
    """Growth of live memory from `before` to `after`, by site, largest first (at most `top`
    sites, each of at least `min_bytes`). Raises SnapshotError when either is not a snapshot."""
    validate(before, "before")
    validate(after, "after")
    b_sites, b_none, b_total, _ = _tally(before)
    a_sites, a_none, a_total, recorded = _tally(after)
    sites: List[Site] = []
    for key, t in a_sites.items():
        prev = b_sites.get(key)
        grown, blocks = _grew(t, prev, min_bytes)
        if not grown:
            continue
        # The stack that gained the most blocks (ties: the most common) stands for the site.
        old = prev.stacks if prev else Counter()
        stack = max(t.stacks, key=lambda s: (t.stacks[s] - old.get(s, 0), t.stacks[s]))
        sites.append(
            Site(
                file=key[0],
                line=key[1],
                function=key[2],
                bytes=grown,
                blocks=blocks,
                stack=[{"file": f, "line": n, "function": fn} for f, n, fn in stack],
            )
        )
    sites.sort(key=lambda s: (-s.bytes, -s.blocks, s.file, s.line, s.function))
    sites = sites[: max(0, top)]
    _annotate(sites)  # among the sites reported, so a note names one the reader sees
    none_bytes, none_blocks = _grew(a_none, b_none, min_bytes)
    return Report(
        total_growth_bytes=max(0, a_total - b_total),
        sites=sites,
        no_stack_bytes=none_bytes,
        no_stack_blocks=none_blocks,
        stacks_recorded=recorded,
        live_bytes=(b_total, a_total),
    )


# --- notes: sites that grow in step --------------------------------------------------------------

_WHY = "a slice or view such as x[:32] keeps its whole base tensor alive, as does an autograd graph that saved it"


def _in_step(a: Site, b: Site) -> bool:
    lo, hi = sorted((a.blocks, b.blocks))
    # Three blocks at least and a whole ratio that a layer count could explain; fewer blocks, or
    # ratios past 64, are too easily a coincidence.
    return lo >= 3 and hi % lo == 0 and hi // lo <= 64


def _passes_to(base: Site, holder: Site) -> Optional[int]:
    """The line from which `base`'s function calls on towards `holder` after allocating `base`'s
    blocks, when `holder`'s stack runs through `base`'s frame (same function and callers)."""
    b, h = base.stack, holder.stack
    for j in range(1, len(h)):
        hf = h[j]
        if (hf["file"], hf["function"]) == (b[0]["file"], b[0]["function"]) and h[j + 1 :] == b[1:]:
            return hf["line"] if hf["line"] > b[0]["line"] else None
    return None


def _annotate(sites: List[Site]) -> None:
    for s in sites:
        partners = [o for o in sites if o is not s and _in_step(s, o)]
        if not partners:
            continue
        o = partners[0]  # sites are sorted: the largest partner
        head = "grows in step with %s (%d blocks here, %d there)" % (o.short(), s.blocks, o.blocks)
        line = _passes_to(s, o)
        if line is not None:
            s.note = "%s: %s allocates these at line %d and then reaches %s from line %d, so what is kept there likely keeps these alive (%s)" % (
                head, s.function, s.line, o.short(), line, _WHY)
        elif _passes_to(o, s) is not None:
            s.note = "%s: what is kept here likely keeps %s's memory alive too (%s)" % (head, o.short(), _WHY)
        else:
            s.note = "%s: one likely keeps the other alive (%s)" % (head, _WHY)


# --- fitting into a protocol line ----------------------------------------------------------------


def _cap(s: Any) -> Any:
    if not isinstance(s, str):
        return s
    # "replace" also turns lone surrogates (possible in a pickle) into "?", which JSON parsers
    # that insist on valid UTF-8 would refuse.
    b = s.encode("utf-8", "replace")
    return b[:MAX_STR].decode("utf-8", "ignore") if len(b) > MAX_STR else b.decode("utf-8")


def _size(obj: Any) -> int:
    return len(json.dumps(obj))  # ASCII (escapes): bytes = characters, never under the UTF-8 size


def fit(sites_json: List[Dict[str, Any]], budget: int) -> List[Dict[str, Any]]:
    """A copy of `sites_json` (Site.as_json() dicts, largest first) that fits the protocol: strings
    at most 512 bytes, stacks at most 32 frames, at most 20 sites, and `json.dumps` of the list at
    most `budget` bytes, got by dropping outer frames (from the longest stacks first), then the
    smallest sites."""
    sites = []
    for s in sites_json[:MAX_SITES]:
        d = {k: _cap(v) for k, v in s.items() if k != "stack"}
        d["stack"] = [{k: _cap(v) for k, v in f.items()} for f in (s.get("stack") or [])[:MAX_STACK]]
        sites.append(d)
    lens = [_size(d) for d in sites]

    def total() -> int:
        return 2 + sum(lens) + 2 * max(0, len(lens) - 1)  # "[" "]" and ", " between

    size = total()
    while size > budget:
        longest = max(range(len(sites)), key=lambda i: (len(sites[i]["stack"]), i), default=None)
        if longest is None or not sites[longest]["stack"]:
            break
        stack = sites[longest]["stack"]
        gone = _size(stack.pop()) + (2 if stack else 0)
        lens[longest] -= gone
        size -= gone
    while size > budget and sites:
        sites.pop()
        lens.pop()
        size = total()
    return sites


# --- text ----------------------------------------------------------------------------------------


def fmt_bytes(n: int) -> str:
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%s%.1f %s" % (sign, n / scale, unit)
    return "%s%d B" % (sign, n)


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _wrap(text: str, width: int, indent: str) -> List[str]:
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


def render(report: Report, before: str = "BEFORE", after: str = "AFTER", *, min_bytes: int = 1 << 20,
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
        return "\n".join(lines) + "\n"
    denom = max(report.total_growth_bytes, sum(s.bytes for s in report.sites)) or 1
    lines += ["", "%10s  %7s  %5s  %s" % ("grew", "blocks", "share", "allocated at")]
    for s in report.sites:
        lines.append("%10s  %7s  %4.0f%%  %s in %s" % (
            fmt_bytes(s.bytes), "+%d" % s.blocks, 100.0 * s.bytes / denom, s.short(), s.function))
        pad = " " * 6
        if s.note:
            lines += _wrap("note: " + s.note, width, pad)
        for i, f in enumerate(s.stack[:frames]):
            lines.append("%s%s %s:%d in %s" % (pad, "at" if i == 0 else "  ", f["file"], f["line"], f["function"]))
        if len(s.stack) > frames:
            lines.append("%s   ... %d more frames" % (pad, len(s.stack) - frames))
    return "\n".join(lines) + "\n"


# --- command line --------------------------------------------------------------------------------

PROG = "python -m gpumon_client diff"


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
        if n < minimum:
            raise argparse.ArgumentTypeError("%d is less than %d" % (n, minimum))
        return n

    return parse


def add_budget(p: argparse.ArgumentParser) -> None:
    """--budget MIB: what reading a snapshot may keep in memory (snapload.DEFAULT_BUDGET)."""
    p.add_argument("--budget", type=_count(1), default=DEFAULT_BUDGET >> 20, metavar="MIB",
                   help="keep at most MIB of a snapshot in memory while reading it; the file itself may be "
                        "any size (default %(default)s)")
    # The former cap on the file's size: now the same budget, on what is kept.
    p.add_argument("--max-size", type=_count(1), dest="budget", help=argparse.SUPPRESS)


def main(argv: Optional[List[str]] = None) -> int:
    """Exit status: 0 nothing grew, 1 growth found (by site, or without stacks), 2 bad input."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Where the live CUDA memory that grew between two torch.cuda.memory snapshots was allocated.",
        epilog="Exit status: 0 nothing grew, 1 growth was found, 2 a file could not be used.",
    )
    p.add_argument("before", metavar="BEFORE.pickle")
    p.add_argument("after", metavar="AFTER.pickle")
    p.add_argument("--json", action="store_true", help="print JSON: {\"sites\": [...], \"total_growth_bytes\": N}")
    p.add_argument("--top", type=_count(1), default=10, metavar="N", help="at most N sites (default 10)")
    p.add_argument("--min-bytes", type=_count(0), default=1 << 20, metavar="B",
                   help="leave out sites that grew by less (default 1 MiB)")
    add_budget(p)
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help 0
        return exc.code if isinstance(exc.code, int) else 2
    try:
        before = load(args.before, budget=args.budget << 20, keep="diff")
        after = load(args.after, budget=args.budget << 20, keep="diff")
    except SnapshotError as exc:
        sys.stderr.write("%s: %s\n" % (PROG, exc))
        return 2
    report = diff(before, after, top=args.top, min_bytes=args.min_bytes)
    if args.json:
        out = report.as_json()
        if report.no_stack_bytes:
            out["no_stack_bytes"] = report.no_stack_bytes
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        sys.stdout.write(render(report, args.before, args.after, min_bytes=args.min_bytes))
    return 1 if report.grew() else 0
