"""Reading `torch.cuda.memory` snapshot pickles without trusting them, streamed.

A snapshot (`torch.cuda.memory._snapshot()`, or the file `torch.cuda.memory._dump_snapshot()`
writes, which is `pickle.dump` of the same dict) is plain data: dicts, lists, tuples, strings,
numbers, booleans and None. Unpickling a file runs whatever callables it names, so files are read
by pickleread.py, which interprets the pickle opcode by opcode and builds plain data only: every
opcode that would reach a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4, REDUCE, NEWOBJ,
BUILD, persistent ids) is refused with `SnapshotError`, naming the opcode and its offset, before
anything runs.

The file is streamed, so its size is not limited: what is kept is. `keep` says what the caller
needs (ALL, the whole snapshot; DIFF, the live blocks; EXPLAIN, the segments and the history
entries' action, address, size and time), frames lists are interned (a snapshot repeats the same
stacks endlessly), and `budget` caps the bytes kept (an estimate; DEFAULT_BUDGET unless told):
past it, the read stops with an error that says so.

Errors are one line that names the file and says why: `SnapshotError` (shape.py, with `validate`).
"""

import io
import os
from typing import Any, Optional, Union

from .pickleread import Limits, ReadError, read
from .pickleschema import DROP, FRAMES, KEEP, Schema
from .shape import SnapshotError, validate

__all__ = ["SnapshotError", "DEFAULT_BUDGET", "ALL", "DIFF", "EXPLAIN", "load", "loads", "validate"]

# About 3.5 million history entries read for `explain`: a 2 GB file of 1M entries keeps 590 MiB by
# the reader's estimate (493 MiB of RSS), `diff` 136 MiB of it.
DEFAULT_BUDGET = 2 << 30

_FRAMES_AND_ALL = {"frames": FRAMES, "*": KEEP}
# The whole snapshot, frames lists interned.
ALL = Schema({"segments": [{"blocks": [_FRAMES_AND_ALL], "frames": FRAMES}],
              "device_traces": [[_FRAMES_AND_ALL]]}, "all")
# What `diff` reads: each block's state, size and stack (torch 2.0 kept it under history).
# Segments keep their (empty) frames list: torch's pickle shares it with their blocks'.
DIFF = Schema({"segments": [{"blocks": [{"state": KEEP, "size": KEEP, "frames": FRAMES, "history": KEEP, "*": DROP}],
                             "frames": FRAMES, "*": DROP}],
               "*": DROP}, "diff")
# What `explain` reads: the segments' blocks and the history, less the entries' other fields.
EXPLAIN = Schema({"segments": [{"device": KEEP, "address": KEEP, "total_size": KEEP,
                                "blocks": [{"address": KEEP, "size": KEEP, "state": KEEP, "frames": FRAMES,
                                            "history": KEEP, "*": DROP}], "frames": FRAMES, "*": DROP}],
                  "device_traces": [[{"action": KEEP, "addr": KEEP, "size": KEEP, "time_us": KEEP, "device_free": KEEP,
                                      "frames": FRAMES, "*": DROP}]],
                  "external_annotations": KEEP, "*": DROP}, "explain")


def _mib(n: int) -> str:
    return "%.1f MiB" % (n / (1 << 20))


class Stats:
    """What a read cost: bytes of file read, bytes kept (estimated), distinct stacks."""

    def __init__(self, file_bytes: int = 0, kept_bytes: int = 0, stacks: int = 0) -> None:
        self.file_bytes, self.kept_bytes, self.stacks = file_bytes, kept_bytes, stacks


last_stats = Stats()  # of the last load()/loads() (for the bench and the command's --stats)


def _why(exc: ReadError, size: Optional[int], budget: int) -> str:
    at = "offset %d" % exc.offset
    if size:
        at += " of %d (%.0f%% through)" % (size, 100.0 * exc.offset / size)
    if exc.what == "refused":
        if "the pickle asks" in exc.why:
            return "refused: %s, and a snapshot is plain data (nothing was run)" % exc.why
        return "refused: %s" % exc.why
    if exc.what == "truncated":
        return "truncated: %s (at %s)" % (exc.why, at)
    if exc.what == "budget":
        return "what it needs kept exceeds the budget of %s at %s (raise it with --budget MIB)" % (_mib(budget), at)
    if exc.what == "limit":
        return "refused: %s" % exc.why
    if exc.what == "layout":
        return "not read: %s" % exc.why
    if exc.why == "empty":
        return "empty, not a snapshot"
    return exc.why


Keep = Union[Schema, str]
_NAMED = {"all": ALL, "diff": DIFF, "explain": EXPLAIN}


def _read(f: Any, name: str, size: Optional[int], keep: Keep, budget: int, check: bool) -> Any:
    global last_stats
    schema = _NAMED[keep] if isinstance(keep, str) else keep
    try:
        obj, r = read(f, schema, Limits(budget=budget))
    except ReadError as exc:
        raise SnapshotError(name, _why(exc, size, budget)) from None
    except OSError as exc:
        raise SnapshotError(name, "cannot read: %s" % (exc.strerror or exc)) from None
    last_stats = Stats(r.end_offset, r.kept, len(r.stacks))
    if check:
        validate(obj, name)
    return obj


def loads(data: bytes, name: str = "<bytes>", *, budget: int = DEFAULT_BUDGET, check: bool = True,
          keep: Keep = ALL) -> Any:
    """The snapshot pickled in `data`, checked (see `validate`) unless `check` is False (then any
    plain data is returned); raises SnapshotError."""
    return _read(io.BytesIO(data), name, len(data), keep, budget, check)


def load(path: str, *, budget: int = DEFAULT_BUDGET, check: bool = True, keep: Keep = ALL) -> Any:
    """The snapshot in the file at `path`, streamed (see the module docstring); raises SnapshotError."""
    name = str(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise SnapshotError(name, "cannot read: %s" % (exc.strerror or exc)) from None
    with f:
        try:
            size: Optional[int] = os.fstat(f.fileno()).st_size
        except OSError:
            size = None
        return _read(f, name, size, keep, budget, check)
