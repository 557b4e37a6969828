"""What a snapshot must look like to be read at all, and the error that says it does not."""

from typing import Any

__all__ = ["SnapshotError", "validate"]


class SnapshotError(Exception):
    """A snapshot that cannot be used: str() is one line naming the file and why."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.why = _one_line(why)
        super().__init__("%s: %s" % (name, self.why))


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
