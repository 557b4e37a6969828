"""What pickleread's modules share: opcode tables, limits, errors, the stand-ins for what a
schema drops, and `ReaderCore`, what picklerare may use of the reader (so that picklerare never
imports pickleread, which imports it)."""

import pickletools
import re
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Protocol, Tuple

from .pickleschema import Schema

NAMES = {ord(op.code.encode("latin-1")): op.name for op in pickletools.opcodes}
# Bytes of argument per opcode: n > 0 fixed, -2/-3/-4/-5 a length in 1/4/4/8 bytes first.
_ARG = {ord(op.code.encode("latin-1")): (op.arg.n if op.arg else 0) for op in pickletools.opcodes}

CHUNK = 256 << 10  # also how often the budget and the stack are checked
MARGIN = 300  # the longest short opcode: LONG1 or SHORT_BINUNICODE with 255 bytes

_I4 = struct.Struct("<i").unpack_from
_U4 = struct.Struct("<I").unpack_from
_F8 = struct.Struct(">d").unpack_from

# What fills a list of frames as pickle.dump writes it once its frames are in the memo: batches
# of BINGET/LONG_BINGET (MARK ... APPENDS), or one BINGET and APPEND.
_FRAMES_RUN = re.compile(rb"(?:\((?:h.|j....)++e|(?:h.|j....)a)*+", re.DOTALL)
_CONSUMED = b"uesa"  # SETITEMS, APPENDS, SETITEM, APPEND: a value's container takes it
_PREFIX = 64  # bytes of a run that key the runs seen (stacks share their innermost frames)

_CALLS = {
    "REDUCE": "to call something", "BUILD": "to set an object's state", "NEWOBJ": "to create an object",
    "NEWOBJ_EX": "to create an object", "OBJ": "to create an object",
}
_TEXT = {"INT", "LONG", "FLOAT", "STRING", "UNICODE", "GET", "PUT"}


class ReadError(Exception):
    """what: refused (code), truncated, malformed, budget, limit or layout."""

    def __init__(self, what: str, why: str, offset: int) -> None:
        self.what, self.why, self.offset = what, why, offset
        super().__init__("%s: %s" % (what, why))


@dataclass
class Limits:
    budget: int = 1 << 30  # estimated bytes kept
    depth: int = 100  # MARK nesting, and nesting of plain data
    stack: int = 1 << 18  # items on the stack, all marks together (pickle.dump: ~1000 a level)
    items: int = 1 << 26  # items in one container
    string: int = 64 << 20  # bytes in one str or bytes
    memo: int = 1 << 27  # memo slots


class _Short(Exception):
    """The file ended inside an opcode."""


class _Dropped:
    """A container the schema drops: fills into it are read and discarded."""

    __slots__ = ()


class _Gone:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<dropped>"


GONE = _Gone()  # the memo's stand-in for what was not kept
_CONTAINERS = (dict, list, set, _Dropped)
_EMPTY: Tuple[()] = ()


def _past_end(buf: bytes, pos: int, end: int) -> bool:
    """Whether the opcode at `pos` needs bytes past `end` (else a failure there is its own)."""
    if pos >= end:
        return True
    n = _ARG.get(buf[pos], 0)
    if n >= 0:
        return pos + 1 + n > end
    head = {-2: 1, -3: 4, -4: 4, -5: 8}.get(n, 0)
    if pos + 1 + head > end:
        return True
    return pos + 1 + head + int.from_bytes(buf[pos + 1: pos + 1 + head], "little") > end


class ReaderCore(Protocol):
    """The reader's state and operations that the seldom-used opcodes (picklerare) work with:
    pickleread.Reader is one (mypy checks it where pickleread hands itself over)."""

    S: Schema
    lim: Limits
    kept: int
    op_at: int
    memo: List[Any]
    runs: Dict[bytes, List[Any]]
    by_prefix: Dict[bytes, List[bytes]]
    kind_of: Dict[int, int]
    frames_memo: Dict[int, int]

    def err(self, what: str, why: str) -> ReadError:
        """The error to raise, at the current opcode's offset."""

    def at(self) -> str:
        """The current opcode and its offset, for messages."""

    def refill(self, buf: bytes, pos: int, need: int) -> bytes:
        """buf from pos on with at least `need` bytes more read, when the file has them."""

    def guess(self, st: List[Any], ms: List[List[Any]], ctype: type) -> int:
        """The kind of a container created now."""

    def tuple_of(self, items: List[Any]) -> Any:
        """A tuple of `items`; GONE when one of them was dropped."""

    def check_depth(self, parent: Any, children: Any, fresh: bool = False) -> None:
        """Plain data: the parent's nesting from its children's, refused past the limit."""

    def appends(self, lst: Any, items: List[Any]) -> None:
        """Fills a list or set (APPENDS, APPEND, ADDITEMS)."""

    def setitems(self, d: Any, items: List[Any]) -> None:
        """Fills a dict with key, value, key, value... (SETITEMS, SETITEM)."""
