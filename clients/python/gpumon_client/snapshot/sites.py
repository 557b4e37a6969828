"""Which frame of a block's stack is the user's: the site a block is charged to, by the rule
`diff`, `explain` and `peak` share.

A site is the innermost frame in the user's code, i.e. a `.py` file (or an `<ipython-input...>`
cell) that is not under site-packages or dist-packages, not in a `/torch/` directory, not in
gpumon_client, not the Python standard library (`.../lib/pythonX.Y/...`), not generated code
(`<frozen ...>`, `<string>`, `<eval_with_key>` of torch.fx, torchinductor's output). When no frame
qualifies the site is the innermost Python frame (else the innermost frame). The site's stack is
its frame and the user frames outward from it (all Python frames for a fallback site).
"""

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["Frame", "Site", "is_user_file", "block_frames", "site_stack", "basename", "as_dicts"]

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
        return "%s:%d" % (basename(self.file), self.line)


def basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


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


def block_frames(block: Dict[str, Any]) -> Any:
    """A block's raw frames (innermost first), or None when it has none."""
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


def site_stack(raw: Sequence[Any]) -> Tuple[Frame, ...]:
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


def as_dicts(stack: Sequence[Frame]) -> List[Dict[str, Any]]:
    """A stack as the JSON and the protocol carry it."""
    return [{"file": f, "line": n, "function": fn} for f, n, fn in stack]
