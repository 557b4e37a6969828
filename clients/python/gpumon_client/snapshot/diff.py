"""Which lines of the trainer allocate the memory that grew between two allocator snapshots.

Input: two `torch.cuda.memory._snapshot()` dicts (or the files `_dump_snapshot()` writes, read by
load.py without running anything), taken while allocation history was recorded so that live
blocks carry the Python stack that allocated them (frames innermost first).

The rule. Only live blocks count (`state == "active_allocated"`). Each is charged to its *site*,
the innermost frame in the user's code (sites.py says which frames are). Per site, both snapshots
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

The text for people is render.py's, the command line cli.py's (`python -m gpumon_client diff`),
the fitting into a protocol line wire.py's.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .shape import validate
from .sites import Frame, Site, as_dicts, block_frames, site_stack

__all__ = ["diff", "Report", "Site"]


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
            raw = block_frames(b)
            if not raw:
                none.blocks += 1
                none.bytes += size
                continue
            stack = cache.get(id(raw))
            if stack is None:
                stack = site_stack(raw)
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
                stack=as_dicts(stack),
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
