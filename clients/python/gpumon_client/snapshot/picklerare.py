"""The opcodes a snapshot seldom has, and those that refuse: functions of the reader's state
(picklebase.ReaderCore, which pickleread's Reader is), apart so that its module stays the hot loop."""

import copyreg
from typing import Any, List, Tuple

from .picklebase import (_CALLS, _EMPTY, _TEXT, _U4, CHUNK, GONE, NAMES, _CONTAINERS, ReaderCore, _Dropped, _Short)
from .pickleschema import DROPPED


def refuse(r: ReaderCore, op: int, buf: bytes, pos: int, st: List[Any]) -> None:
    name = NAMES.get(op)
    what = None
    if name in ("GLOBAL", "INST"):
        lines = buf[pos + 1: pos + 1 + 600].split(b"\n", 2)
        if len(lines) >= 2:
            what = "%s.%s" % (lines[0].decode("latin-1")[:200], lines[1].decode("latin-1")[:200])
    elif name == "STACK_GLOBAL" and len(st) >= 2 and isinstance(st[-1], str) and isinstance(st[-2], str):
        what = "%s.%s" % (st[-2][:200], st[-1][:200])
    elif name in ("EXT1", "EXT2", "EXT4"):
        size = {"EXT1": 1, "EXT2": 2, "EXT4": 4}[name]
        code = int.from_bytes(buf[pos + 1: pos + 1 + size], "little")
        found = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        what = "%s.%s" % found if found else "extension code %d" % code
    elif name in ("PERSID", "BINPERSID"):
        what = "a persistent id"
    elif name in ("NEXT_BUFFER", "READONLY_BUFFER"):
        what = "an out-of-band buffer"
    if what is None:
        raise r.err("refused", "the pickle asks %s (%s)" % (_CALLS.get(name or "", "to run code"), r.at()))
    raise r.err("refused", "the pickle asks for %s (%s)" % (what, r.at()))


def skip(r: ReaderCore, buf: bytes, pos: int, n: int) -> Tuple[bytes, int, int]:
    while n > len(buf) - pos:
        n -= len(buf) - pos
        buf = r.refill(buf, len(buf), CHUNK)
        pos = 0
        if not buf:
            raise _Short()
    return buf, pos + n, len(buf)


def put(r: ReaderCore, idx: int, v: Any) -> None:
    memo = r.memo
    if idx == len(memo):
        memo.append(v)
    elif idx < len(memo):
        memo[idx] = v
        r.runs.clear()  # a run's indices may now mean other objects
        r.by_prefix.clear()
    elif idx - len(memo) <= 1 << 16:
        memo.extend([GONE] * (idx - len(memo)))
        memo.append(v)
        r.kept += 8 * (idx - len(memo))
    else:
        raise r.err("limit", "memo index %d far past the %d defined (%s)" % (idx, len(memo), r.at()))


def memo_value(r: ReaderCore, v: Any, idx: int) -> Any:
    """What the memo keeps for `v` at slot idx: GONE for what is not kept or may not be shared."""
    if type(v) in _CONTAINERS:
        k = r.kind_of.get(id(v))
        if k is not None and (k == DROPPED or not r.S.shareable[k]):
            return GONE
        if k == r.S.frames:
            r.frames_memo[id(v)] = idx  # the interned list replaces it there (see _intern)
    return v


def rare(r: ReaderCore, op: int, buf: bytes, pos: int, end: int, st: List[Any],
         ms: List[List[Any]]) -> Tuple[bytes, int, int, List[Any]]:
    """The opcodes snapshots seldom use; returns (buf, pos, end, st)."""
    name = NAMES.get(op)
    v: Any
    if name is None:
        raise r.err("malformed", "not a pickle (unknown opcode 0x%02x at offset %d)" % (op, r.op_at))
    if name == "PROTO":
        if buf[pos + 1] > 5:
            raise r.err("malformed", "not a pickle this reader knows (protocol %d)" % buf[pos + 1])
        return buf, pos + 2, end, st
    if name in _TEXT:
        raise r.err("malformed", "not a pickle of protocol 2 to 5 (a protocol 0 text opcode, %s)" % r.at())
    if name in ("BINPUT", "LONG_BINPUT"):
        idx, n = (buf[pos + 1], 2) if name == "BINPUT" else (_U4(buf, pos + 1)[0], 5)
        put(r, idx, memo_value(r, st[-1], idx))
        r.kept += 8
        return buf, pos + n, end, st
    if name in ("BINUNICODE", "BINUNICODE8", "BINBYTES", "BINBYTES8", "SHORT_BINBYTES", "BYTEARRAY8",
                "BINSTRING", "SHORT_BINSTRING", "LONG4"):
        hdr = 1 if name in ("SHORT_BINBYTES", "SHORT_BINSTRING") else 8 if name.endswith("8") else 4
        if pos + 1 + hdr > end:
            buf = r.refill(buf, pos, 1 + hdr)
            pos, end = 0, len(buf)
            if pos + 1 + hdr > end:
                raise _Short()
        n = int.from_bytes(buf[pos + 1: pos + 1 + hdr], "little")
        if n > 255 and r.guess(st, ms, str) == DROPPED:
            # Not built, not kept: skipped as it streams by, whatever its length.
            buf, pos, end = skip(r, buf, pos + 1 + hdr, n)
            st.append(GONE)
            return buf, pos, end, st
        if n > r.lim.string:
            raise r.err("limit", "a string of %d bytes, more than the %d allowed (%s)" % (n, r.lim.string, r.at()))
        start = pos + 1 + hdr
        if start + n > end:
            buf = r.refill(buf, pos, 1 + hdr + n)
            start -= pos
            pos, end = 0, len(buf)
            if start + n > end:
                raise _Short()
        raw = buf[start: start + n]
        r.kept += 49 + n
        if name.startswith("BINUNICODE"):
            v = raw.decode("utf-8", "surrogatepass")
        elif "STRING" in name:
            v = raw.decode("ascii")
        elif name == "LONG4":
            v = int.from_bytes(raw, "little", signed=True)
        else:
            v = bytearray(raw) if name == "BYTEARRAY8" else bytes(raw)
        st.append(v)
        return buf, start + n, end, st
    if name == "EMPTY_TUPLE":
        st.append(_EMPTY)
        return buf, pos + 1, end, st
    if name in ("TUPLE", "FROZENSET", "LIST", "DICT"):
        items, st = st, ms.pop()
        if name == "TUPLE":
            st.append(r.tuple_of(items))
        elif name == "FROZENSET":
            t = r.tuple_of(items)
            fs = GONE if t is GONE else frozenset(t)
            if fs is not GONE:
                r.check_depth(fs, t, True)
            st.append(fs)
        else:  # protocol 1 forms of EMPTY_LIST/EMPTY_DICT and their fills
            ctype = list if name == "LIST" else dict
            k = r.guess(st, ms, ctype)
            v = _Dropped() if k == DROPPED else ctype()
            r.kind_of[id(v)] = k
            if name == "LIST":
                r.appends(v, items)
            else:
                r.setitems(v, items)
            r.kind_of[id(v)] = k
            st.append(v)
        return buf, pos + 1, end, st
    if name == "APPEND":
        v = st.pop()
        r.appends(st[-1], [v])
        return buf, pos + 1, end, st
    if name == "SETITEM":
        v = st.pop()
        key = st.pop()
        r.setitems(st[-1], [key, v])
        return buf, pos + 1, end, st
    if name == "ADDITEMS":
        items, st = st, ms.pop()
        r.appends(st[-1], items)
        return buf, pos + 1, end, st
    if name == "POP":
        if not st:
            return buf, pos + 1, end, ms.pop()  # as pickle does: POP on an empty stack pops a mark
        v = st.pop()
        if type(v) in _CONTAINERS:
            r.kind_of.pop(id(v), None)
        return buf, pos + 1, end, st
    if name == "POP_MARK":
        for v in st:
            if type(v) in _CONTAINERS:
                r.kind_of.pop(id(v), None)
        return buf, pos + 1, end, ms.pop()
    if name == "DUP":
        v = st[-1]
        if type(v) in _CONTAINERS:
            raise r.err("refused", "DUP of a container shares it (%s)" % r.at())
        st.append(v)
        return buf, pos + 1, end, st
    refuse(r, op, buf, pos, st)
    raise AssertionError("unreachable")
