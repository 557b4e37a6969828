"""Reading `torch.cuda.memory` snapshot pickles without trusting them.

A snapshot (`torch.cuda.memory._snapshot()`, or the file `torch.cuda.memory._dump_snapshot()`
writes, which is `pickle.dump` of the same dict) is plain data: dicts, lists, tuples, strings,
numbers, booleans and None. Unpickling a file runs whatever callables it names, so files are read
with an unpickler that resolves no global at all (`find_class`) and no persistent id: every way a
pickle has to reach a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4 and REDUCE, NEWOBJ,
BUILD on what those returned) goes through one of the two, so a file that tries to call anything
is refused with `SnapshotError` before anything runs. Files larger than `MAX_FILE_BYTES` are
refused before reading (a snapshot is usually a few MB; unpickled data takes about 6x its file).

Errors are one line that names the file and says why: `SnapshotError`.
"""

import io
import os
import pickle
from typing import Any, Dict

__all__ = ["SnapshotError", "MAX_FILE_BYTES", "load", "loads", "validate"]

# A snapshot with 100,000 history entries and Python stacks is tens of MB; 256 MiB leaves room for
# C++ stacks while bounding the memory a hostile file can make us allocate (a few GiB at most).
MAX_FILE_BYTES = 256 << 20


class SnapshotError(Exception):
    """A snapshot that cannot be used: str() is one line naming the file and why."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.why = _one_line(why)
        super().__init__("%s: %s" % (name, self.why))


class _Refused(Exception):
    pass


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise _Refused("%s.%s" % (module, name))

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mib(n: int) -> str:
    return "%.1f MiB" % (n / (1 << 20))


def loads(data: bytes, name: str = "<bytes>", *, max_bytes: int = MAX_FILE_BYTES, check: bool = True) -> Any:
    """The snapshot pickled in `data`, checked (see `validate`) unless `check` is False (then any
    plain data is returned); raises SnapshotError."""
    if len(data) > max_bytes:
        raise SnapshotError(name, "%s, more than the %s a snapshot may have here" % (_mib(len(data)), _mib(max_bytes)))
    if not data:
        raise SnapshotError(name, "empty, not a snapshot")
    try:
        obj = _PlainDataUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise SnapshotError(
            name, "refused: the pickle asks for %s, and a snapshot is plain data (nothing was run)" % exc
        ) from None
    except EOFError:
        raise SnapshotError(name, "truncated: the pickle ends before its STOP opcode") from None
    except pickle.UnpicklingError as exc:
        msg = str(exc)
        if "truncated" in msg:
            raise SnapshotError(name, "truncated: %s" % msg) from None
        raise SnapshotError(name, "not a pickle (%s)" % msg) from None
    except MemoryError:
        raise SnapshotError(name, "out of memory while unpickling") from None
    except Exception as exc:  # a malformed stream raises many kinds (ValueError, KeyError, ...)
        raise SnapshotError(name, "not a readable pickle (%s: %s)" % (type(exc).__name__, exc)) from None
    if check:
        validate(obj, name)
    return obj


def load(path: str, *, max_bytes: int = MAX_FILE_BYTES, check: bool = True) -> Any:
    """The snapshot in the file at `path`, read with the plain-data unpickler; raises SnapshotError."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            size = _size(f)
            if size is not None and size > max_bytes:
                raise SnapshotError(name, "%s, more than the %s a snapshot may have here" % (_mib(size), _mib(max_bytes)))
            data = _read_at_most(f, max_bytes + 1)
    except OSError as exc:
        raise SnapshotError(name, "cannot read: %s" % (exc.strerror or exc)) from None
    return loads(data, name, max_bytes=max_bytes, check=check)


def _read_at_most(f: Any, limit: int) -> bytes:
    # In pieces: one read(limit) would reserve `limit` bytes up front, and a file that is not
    # what fstat said (a pipe, a device, one still being written) stops at the limit anyway.
    chunks, total = [], 0
    while total < limit:
        chunk = f.read(min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _size(f: Any) -> Any:
    try:
        return os.fstat(f.fileno()).st_size
    except (OSError, ValueError):
        return None


def validate(snapshot: Any, name: str = "<snapshot>") -> None:
    """Checks the skeleton the diff reads: a dict whose `segments` is a list of dicts, each with a
    list of `blocks` that are dicts with a string `state` and an integer `size`. Frames are read
    leniently later (a malformed frame reads as unknown), so they are not checked here."""
    if not isinstance(snapshot, dict):
        raise SnapshotError(name, "not a torch.cuda.memory snapshot: a dict expected, found %s" % type(snapshot).__name__)
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        found = "no 'segments'" if "segments" not in snapshot else "'segments' is a %s" % type(segments).__name__
        raise SnapshotError(name, "not a torch.cuda.memory snapshot: a dict with a 'segments' list expected, %s" % found)
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise SnapshotError(name, "segment %d is a %s, not a dict" % (i, type(seg).__name__))
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise SnapshotError(name, "segment %d: 'blocks' is a %s, not a list" % (i, type(blocks).__name__))
        for j, b in enumerate(blocks):
            if not isinstance(b, dict):
                raise SnapshotError(name, "segment %d block %d is a %s, not a dict" % (i, j, type(b).__name__))
            if not isinstance(b.get("state"), str):
                raise SnapshotError(name, "segment %d block %d: 'state' is missing or not a string" % (i, j))
            size = b.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 62:
                raise SnapshotError(name, "segment %d block %d: 'size' is missing or not a byte count" % (i, j))
