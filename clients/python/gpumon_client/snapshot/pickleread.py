"""A pickle reader that streams: plain data only, kept by a schema, within a budget.

`read(f, schema)` interprets a pickle (protocol 2 to 5) opcode by opcode from a binary file,
buffered, and builds only plain data: dict, list, tuple, set, str, bytes, int, float, bool, None.
Every opcode that could run code is refused where it stands, with its name and offset, before
anything after it is read: GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE, BUILD, NEWOBJ, NEWOBJ_EX,
EXT1/2/4, PERSID, BINPERSID, and the out-of-band buffers of protocol 5. That is the rule of
the former unpickler of load.py (no global resolved, no persistent id), applied to the opcodes.

Memory follows what is kept, not the file. The schema (pickleschema.py) says per place what to
keep; what it drops is read and checked but not built, and never enters the memo. Lists of frames
are interned. `kept` estimates the bytes held (objects, memo slots, interned stacks) and the read
stops past `Limits.budget`. Bombs are refused with bounded memory: nesting (marks and plain-data
depth), items on the stack, items per container, string length and memo slots have limits;
structural places (segments, blocks, history entries) can't be shared through the memo; a
container can't be referred to while it is being built (no cycles) nor filled once complete.

Where a new container goes (its kind) is read from the stack when it is created, as
`pickle.dump` lays data out (MARK batches, single APPEND/SETITEM); where a layout is ambiguous the
schema decides, and the guess is checked when the container is attached to its parent: a pickle
laid out otherwise is refused as such rather than read wrongly.

picklebase.py holds the tables, limits and errors; picklerare.py the opcodes snapshots seldom
use and those that refuse; this module the loop over the frequent ones.
"""

import struct
from typing import Any, BinaryIO, Dict, List, Optional, Set, Tuple

from . import picklerare
from .picklebase import (_CONSUMED, _CONTAINERS, _FRAMES_RUN, _I4, _F8, _PREFIX, _U4, CHUNK, GONE, MARGIN, NAMES, Limits,
                         ReadError, _Dropped, _past_end, _Short)
from .pickleschema import DROPPED, OTHER, Schema

__all__ = ["ReadError", "Limits", "Reader", "read"]


class Reader:
    def __init__(self, f: BinaryIO, schema: Schema, limits: Optional[Limits] = None) -> None:
        self.f = f
        self.S = schema
        self.lim = limits or Limits()
        self.kept = 0
        self.base = 0  # file offset of buf[0]
        self.eof = False
        self.memo: List[Any] = []
        self.kind_of: Dict[int, int] = {}  # id -> kind, for containers being built
        self.depth_of: Dict[int, int] = {}  # id -> nesting, for plain data deeper than 1
        self.fast: Dict[int, Tuple[List[Any], int]] = {}  # frames placeholder -> (interned, memo slot)
        self.frames_memo: Dict[int, int] = {}  # open frames list -> its memo slot
        self.runs: Dict[bytes, List[Any]] = {}  # a frames list's opcodes -> the interned list
        self.by_prefix: Dict[bytes, List[bytes]] = {}  # the first bytes of runs -> the runs
        self.stacks: Dict[Tuple[int, ...], List[Any]] = {}  # ids of frames -> the interned list
        self.frame_dicts: Dict[Tuple[Any, ...], Dict[Any, Any]] = {}
        self.shared: Set[int] = set()  # ids of containers referred to before they were attached
        self.rooted = False
        self.op_at = 0

    # --- errors ------------------------------------------------------------------------------

    def err(self, what: str, why: str) -> ReadError:
        return ReadError(what, why, self.op_at)

    def at(self) -> str:
        return "%s at offset %d" % (NAMES.get(self._op, "opcode 0x%02x" % self._op), self.op_at)

    _op = 0

    # --- the stream --------------------------------------------------------------------------

    def refill(self, buf: bytes, pos: int, need: int) -> bytes:
        """buf from pos on with at least `need` bytes more read, when the file has them."""
        self.base += pos
        rest = buf[pos:]
        parts = [rest]
        have = len(rest)
        while not self.eof and have < need:
            chunk = self.f.read(max(CHUNK, need - have))
            if not chunk:
                self.eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        self._checks()
        return b"".join(parts) if len(parts) > 1 else rest

    def _checks(self) -> None:
        # Per chunk read, not per opcode: growth between two checks is bounded by a chunk.
        self.op_at = self.base
        if self.kept > self.lim.budget:
            raise self.err("budget", "keeps more than the budget of %.0f MiB" % (self.lim.budget / (1 << 20)))
        depth = sum(len(s) for s in self._ms) + len(self._st)
        if depth > self.lim.stack:
            raise self.err("limit", "more than %d items on the stack" % self.lim.stack)
        if len(self.memo) > self.lim.memo:
            raise self.err("limit", "more than %d memo entries" % self.lim.memo)

    _ms: List[List[Any]] = []
    _st: List[Any] = []

    # --- kinds ------------------------------------------------------------------------------

    def guess(self, st: List[Any], ms: List[List[Any]], ctype: type) -> int:
        """The kind of a container created now: see the module docstring. Two readings compete:
        the next item of the current MARK batch (its owner below the mark), or the single item of
        a container just below (APPEND into st[-1], SETITEM into st[-2] under key st[-1]). The
        batch reading holds only if what the batch has so far fits it; else the single one."""
        kind_of, S = self.kind_of, self.S
        n = len(st)
        if n & 1 and ms and ms[-1] and type(st[-1]) is str:
            o = ms[-1][-1]
            if type(o) is dict and (n == 1 or type(st[-2]) is not dict or id(st[-2]) not in kind_of):
                ko = kind_of.get(id(o))
                if ko is not None:  # a value in a dict's batch, and nothing else it could be
                    return S.fit(S.child(ko, st[-1]), ctype)
        c, c_fits = -1, True
        if ms:
            below = ms[-1]
            if below:
                o = below[-1]
                ko = kind_of.get(id(o))
                if ko is not None:
                    to = type(o)
                    if to is list:
                        c = S.item(ko)
                        c_fits = not n or self._fits(st[-1], c)
                    elif to is dict:
                        if n & 1:
                            c = S.child(ko, st[-1])
                            c_fits = n < 3 or self._fits(st[-2], S.child(ko, st[-3]))
                    elif to is _Dropped:
                        c = DROPPED
        x, filled = -1, 0
        if n:
            top = st[-1]
            tt = type(top)
            if tt is list or tt is _Dropped:
                kt = kind_of.get(id(top))
                if kt is not None:
                    x = S.item(kt) if tt is list else DROPPED
                    filled = len(top) if tt is list else 0
            elif n >= 2 and (tt is str or tt is int):
                d = st[-2]
                td = type(d)
                if td is dict or td is _Dropped:
                    kd = kind_of.get(id(d))
                    if kd is not None:
                        x = S.child(kd, top) if td is dict else DROPPED
                        filled = len(d) if td is dict else 0
        elif not ms and not self.rooted:
            self.rooted = True
            return S.fit(S.root, ctype)
        if x < 0:
            return S.fit(c, ctype) if c >= 0 else OTHER
        fx = S.fit(x, ctype)
        if c < 0 or not c_fits:
            return fx
        fc = S.fit(c, ctype)
        if fx == fc:
            return fx
        if filled % 1000:
            return fc  # pickle.dump fills a container by one APPEND/SETITEM only when it is empty
        x_fits, c_fits = x <= DROPPED or fx == x, c <= DROPPED or fc == c
        if x_fits != c_fits:
            return fx if x_fits else fc  # e.g. an entry of a trace, not a trace
        if OTHER in (fx, fc):
            return OTHER  # both readings hold: keep it whole (a superset of either)
        return fc if fc > DROPPED else fx

    def _fits(self, v: Any, kind: int) -> bool:
        """Whether `v`, already on the stack, reads as a value of `kind` there."""
        tv = type(v)
        if tv in _CONTAINERS:
            k = self.kind_of.get(id(v))
            if k is not None:
                return k == (DROPPED if tv is _Dropped else self.S.fit(kind, tv)) or k == OTHER
        return kind <= DROPPED or (self.S.shareable[kind] and tv is self.S.ctype[kind])

    def _close(self, v: Any, expected: int, kept: bool) -> Any:
        """`v` attached where a value of kind `expected` goes; returns what to store (a list of
        frames is interned here)."""
        tv = type(v)
        if tv is dict or tv is list or tv is set or tv is _Dropped:
            k = self.kind_of.pop(id(v), None)
            if self.shared:
                self.shared.discard(id(v))
            if k is None:
                if kept and expected > DROPPED and not self.S.shareable[expected]:
                    raise self.err("refused", "a %s is shared through the memo (%s); a snapshot never shares one"
                                    % (self.S.labels[expected], self.at()))
                return v
            exp = expected if expected <= DROPPED or self.S.ctype[expected] is tv else OTHER
            if k != exp and k != OTHER:  # read whole where less was asked: more than needed, not wrong
                raise self.err("layout", "a %s where a %s goes (%s): not laid out as pickle.dump writes"
                                % (self.S.labels[k], self.S.labels[exp], self.at()))
            if k == self.S.frames:
                return self._intern(v)
            return v
        if v is GONE and kept:
            raise self.err("refused", "refers back to data that was not kept or may not be shared (%s)" % self.at())
        return v

    def check_depth(self, parent: Any, children: Any, fresh: bool = False) -> None:
        """Plain data: the parent's nesting from its children's, refused past the limit. `fresh`:
        the parent was made just now from `children` (a stale entry may have its id)."""
        depth_of = self.depth_of
        d = 1 if fresh else depth_of.get(id(parent), 1)
        for c in children:
            if type(c) in (dict, list, tuple, set, frozenset):
                cd = depth_of.get(id(c), 1) + 1
                if cd > d:
                    d = cd
        if d > 1:
            if d > self.lim.depth:
                raise self.err("limit", "plain data nested deeper than %d (%s)" % (self.lim.depth, self.at()))
            depth_of[id(parent)] = d
        elif fresh and depth_of:
            depth_of.pop(id(parent), None)

    def _intern(self, v: List[Any]) -> List[Any]:
        fl = self.fast.pop(id(v), None)
        if fl is not None:
            res, slot = fl
        else:
            key = tuple(map(id, v))
            res = self.stacks.get(key)  # type: ignore[assignment]
            if res is None:
                self.stacks[key] = res = v
                self.kept += 64 + 8 * len(v) + 8 * len(key)
            slot = self.frames_memo.pop(id(v), -1)
        if slot >= 0:
            self.memo[slot] = res
        return res

    def _frame_dict(self, d: Dict[Any, Any]) -> Dict[Any, Any]:
        # Writers that do not memoize repeat each frame: one dict per distinct frame.
        if len(d) > 4:
            return d
        try:
            key = tuple(d.items())
            return self.frame_dicts.setdefault(key, d)
        except TypeError:
            return d

    def _run_list(self, run: bytes) -> List[Any]:
        """The interned list a run of BINGETs (see _FRAMES_RUN) builds."""
        memo, kind_of = self.memo, self.kind_of
        out = []
        i, n = 0, len(run)
        while i < n:
            op = run[i]
            if op == 0x68:  # BINGET
                idx = run[i + 1]
                i += 2
            elif op == 0x6A:  # LONG_BINGET
                idx = _U4(run, i + 1)[0]
                i += 5
            else:  # MARK, APPENDS, APPEND
                i += 1
                continue
            if idx >= len(memo):
                raise self.err("malformed", "not a pickle (memo index %d is not defined, %s)" % (idx, self.at()))
            v = memo[idx]
            if v is GONE:
                raise self.err("refused", "refers back to data that was not kept or may not be shared (%s)" % self.at())
            if type(v) in _CONTAINERS and id(v) in kind_of:
                self.shared.add(id(v))
            out.append(v)
        key = tuple(map(id, out))
        res = self.stacks.get(key)
        if res is None:
            self.stacks[key] = res = out
            self.kept += 64 + 16 * len(out)
        self.kept += len(run) + 80
        self.runs[run] = res
        return res

    # --- fills -------------------------------------------------------------------------------

    def _open(self, target: Any) -> int:
        k = self.kind_of.get(id(target))
        if k is None or type(target) not in _CONTAINERS:
            raise self.err("refused" if type(target) in (dict, list, set) else "malformed",
                            "fills a container that is complete or not a container (%s)" % self.at())
        if self.shared and id(target) in self.shared:
            # Referred to through the memo and filled after: how a cycle is made.
            raise self.err("refused", "fills a container after referring to it (%s)" % self.at())
        return k

    def setitems(self, d: Any, items: List[Any]) -> None:
        k = self._open(d)
        if len(items) & 1:
            raise self.err("malformed", "not a pickle (%s: a key without a value)" % self.at())
        S = self.S
        if k == DROPPED:
            for v in items:
                self._close(v, DROPPED, False)
            return
        if type(d) is not dict:
            raise self.err("malformed", "not a pickle (%s on a %s)" % (self.at(), type(d).__name__))
        keys = S.keys[k]
        close = self._close
        if keys is None:  # plain data
            for i in range(0, len(items), 2):
                d[items[i]] = close(items[i + 1], OTHER, True)
            self.check_depth(d, items[1::2])
            self.kept += 72 * (len(items) >> 1)
        else:
            default = S.default[k]
            n = 0
            for i in range(0, len(items), 2):
                key, v = items[i], items[i + 1]
                try:
                    ck = keys.get(key, default)
                except TypeError:
                    raise self.err("malformed", "not a pickle (%s: an unhashable key)" % self.at()) from None
                if type(v) in _CONTAINERS or v is GONE:
                    v = close(v, ck, ck != DROPPED)
                if ck != DROPPED:
                    d[key] = v
                    n += 1
            self.kept += 72 * n
        if len(d) > self.lim.items:
            raise self.err("limit", "a dict of more than %d items (%s)" % (self.lim.items, self.at()))

    def appends(self, lst: Any, items: List[Any]) -> None:
        k = self._open(lst)
        if k == DROPPED:
            for v in items:
                self._close(v, DROPPED, False)
            return
        if type(lst) is set:
            for v in items:
                self._close(v, OTHER, True)
            lst.update(items)
            self.check_depth(lst, items)
            self.kept += 40 * len(items)
            return
        if type(lst) is not list:
            raise self.err("malformed", "not a pickle (%s on a %s)" % (self.at(), type(lst).__name__))
        fl = self.fast.pop(id(lst), None)
        if fl is not None:  # a frames list read fast, now filled further: the real list after all
            lst.extend(fl[0])
            if fl[1] >= 0:
                self.frames_memo[id(lst)] = fl[1]
        ek = self.S.item(k)
        kind_of = self.kind_of
        out = []
        extra = 0
        for v in items:
            tv = type(v)
            if tv is dict or tv is list or tv is set or tv is _Dropped or v is GONE:
                if k == self.S.frames and tv is dict and kind_of.get(id(v)) == OTHER:
                    kind_of.pop(id(v))
                    v = self._frame_dict(v)
                else:
                    v = self._close(v, ek, True)
            elif tv is int or tv is float:
                extra += 24
            elif tv is str or tv is bytes:
                extra += 8
            out.append(v)
        lst.extend(out)
        if ek == OTHER:
            self.check_depth(lst, out)
        self.kept += 8 * len(out) + extra
        if len(lst) > self.lim.items:
            raise self.err("limit", "a list of more than %d items (%s)" % (self.lim.items, self.at()))

    def tuple_of(self, items: List[Any]) -> Any:
        """A tuple of `items`; GONE when one of them was dropped (the tuple goes where they did)."""
        if any(v is GONE or type(v) is _Dropped for v in items):
            for w in items:
                self._close(w, DROPPED, False)
            return GONE
        for i, v in enumerate(items):
            if type(v) in _CONTAINERS:
                k = self.kind_of.pop(id(v), None)
                if k == self.S.frames:
                    self.kind_of[id(v)] = k
                    items[i] = self._intern(v)
                    self.kind_of.pop(id(v), None)
        t = tuple(items)
        self.check_depth(t, t, True)
        self.kept += 56 + 8 * len(t)
        return t

    # --- the loop ------------------------------------------------------------------------------

    def read(self) -> Any:
        try:
            return self._loop()
        except ReadError:
            raise
        except _Short:
            raise self.err("truncated", "the pickle ends before its STOP opcode") from None
        except (IndexError, struct.error):
            raise self.err("malformed", "not a pickle (%s: a stack item, mark or memo entry that is not there)"
                            % self.at()) from None
        except (UnicodeDecodeError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise self.err("malformed", "not a pickle (%s: %s)" % (self.at(), exc)) from None
        except MemoryError:
            raise self.err("limit", "out of memory while reading") from None

    _end = 0

    def _loop(self) -> Any:  # noqa: C901 - one loop, the opcodes in order of frequency
        buf = self.refill(b"", 0, CHUNK)
        if not buf:
            raise self.err("malformed", "empty")
        pos, end = 0, len(buf)
        self._end = end
        safe = end if self.eof else end - MARGIN
        st: List[Any] = []
        ms: List[List[Any]] = []
        self._st, self._ms = st, ms
        memo, kind_of, S = self.memo, self.kind_of, self.S
        frames_kind = S.frames
        lim = self.lim
        batch: Any = None
        batch_kind = OTHER
        try:
            while True:
                if pos >= safe:
                    if self.eof:
                        if pos >= end:
                            self.op_at = self.base + pos
                            raise self.err("truncated", "the pickle ends before its STOP opcode")
                    else:
                        self._st, self._ms = st, ms
                        buf = self.refill(buf, pos, CHUNK)
                        pos, end = 0, len(buf)
                        self._end = end
                        safe = end if self.eof else end - MARGIN
                        continue
                op = buf[pos]
                if op == 0x68:  # BINGET
                    v = memo[buf[pos + 1]]
                    if type(v) in _CONTAINERS and id(v) in kind_of:
                        self.shared.add(id(v))  # complete from now on: no cycle can form
                    st.append(v)
                    pos += 2
                elif op == 0x94:  # MEMOIZE
                    v = st[-1]
                    tv = type(v)
                    if tv is dict or tv is list or tv is set or tv is _Dropped:
                        k = kind_of.get(id(v))
                        if k is not None and (k == DROPPED or not S.shareable[k]):
                            v = GONE
                        elif k == frames_kind:
                            self.frames_memo[id(v)] = len(memo)
                    memo.append(v)
                    self.kept += 8
                    pos += 1
                elif op == 0x6A:  # LONG_BINGET
                    v = memo[_U4(buf, pos + 1)[0]]
                    if type(v) in _CONTAINERS and id(v) in kind_of:
                        self.shared.add(id(v))
                    st.append(v)
                    pos += 5
                elif op == 0x8C:  # SHORT_BINUNICODE
                    n = buf[pos + 1]
                    if pos + 2 + n > end:
                        raise IndexError
                    st.append(buf[pos + 2: pos + 2 + n].decode("utf-8", "surrogatepass"))
                    self.kept += 49 + n
                    pos += 2 + n
                elif op == 0x4B:  # BININT1
                    st.append(buf[pos + 1])
                    pos += 2
                elif op == 0x8A:  # LONG1
                    n = buf[pos + 1]
                    if pos + 2 + n > end:
                        raise IndexError
                    st.append(int.from_bytes(buf[pos + 2: pos + 2 + n], "little", signed=True))
                    pos += 2 + n
                elif op == 0x28:  # MARK
                    ms.append(st)
                    st = []
                    if len(ms) > lim.depth:
                        self._op, self.op_at = op, self.base + pos
                        raise self.err("limit", "marks nested deeper than %d (%s)" % (lim.depth, self.at()))
                    pos += 1
                elif op == 0x75:  # SETITEMS
                    self._op, self.op_at = op, self.base + pos
                    items = st
                    st = ms.pop()
                    self.setitems(st[-1], items)
                    pos += 1
                elif op == 0x65:  # APPENDS
                    self._op, self.op_at = op, self.base + pos
                    items = st
                    st = ms.pop()
                    self.appends(st[-1], items)
                    pos += 1
                elif op == 0x7D or op == 0x5D or op == 0x8F:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
                    self._op, self.op_at = op, self.base + pos
                    ctype = dict if op == 0x7D else list if op == 0x5D else set
                    if op == 0x7D and st is batch and type(st[-1]) is dict:
                        k = batch_kind  # the next dict of a batch of dicts (history entries, blocks)
                    else:
                        k = self.guess(st, ms, ctype)
                        if op == 0x7D and ms and ms[-1] and type(ms[-1][-1]) is list and (not st or type(st[-1]) is dict):
                            batch, batch_kind = st, k
                    pos += 1
                    if op == 0x5D and (k == frames_kind or k == DROPPED):
                        if end - pos < 1 << 16 and not self.eof:
                            self._st, self._ms = st, ms
                            buf = self.refill(buf, pos, CHUNK)
                            pos, end = 0, len(buf)
                            self._end = end
                            safe = end if self.eof else end - MARGIN
                        v, pos = self._fast_list(buf, pos, k)
                        if v is not None:
                            if type(v) is _Dropped or id(v) in self.fast:
                                kind_of[id(v)] = k  # still open: more may be appended to it
                            st.append(v)
                            continue
                    if k == DROPPED:
                        v = _Dropped()
                    else:
                        v = {} if op == 0x7D else [] if op == 0x5D else set()
                        self.kept += 64
                        if self.depth_of:
                            self.depth_of.pop(id(v), None)
                    kind_of[id(v)] = k
                    st.append(v)
                elif op == 0x4A:  # BININT
                    st.append(_I4(buf, pos + 1)[0])
                    pos += 5
                elif op == 0x4D:  # BININT2
                    st.append(buf[pos + 1] | buf[pos + 2] << 8)
                    pos += 3
                elif op == 0x95:  # FRAME
                    pos += 9
                elif op == 0x89:  # NEWFALSE
                    st.append(False)
                    pos += 1
                elif op == 0x88:  # NEWTRUE
                    st.append(True)
                    pos += 1
                elif op == 0x4E:  # NONE
                    st.append(None)
                    pos += 1
                elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1..3
                    self._op, self.op_at = op, self.base + pos
                    n = op - 0x84
                    if len(st) < n:
                        raise IndexError
                    items = st[-n:]
                    del st[-n:]
                    st.append(self.tuple_of(items))
                    pos += 1
                elif op == 0x47:  # BINFLOAT
                    st.append(_F8(buf, pos + 1)[0])
                    pos += 9
                elif op == 0x2E:  # STOP
                    self._op, self.op_at = op, self.base + pos
                    v = st.pop()
                    if type(v) in _CONTAINERS:
                        k = kind_of.pop(id(v), OTHER)
                        if k == frames_kind:
                            v = self._intern(v)
                        elif type(v) is _Dropped:
                            v = None
                    if v is GONE:
                        v = None
                    self.end_offset = self.base + pos + 1
                    if self.kept > lim.budget:
                        raise self.err("budget", "keeps more than the budget")
                    return v
                else:
                    self._op, self.op_at = op, self.base + pos
                    self._st, self._ms = st, ms
                    buf, pos, end, st = picklerare.rare(self, op, buf, pos, end, st, ms)
                    self._end = end
                    safe = end if self.eof else end - MARGIN
        except (IndexError, struct.error):
            self.op_at = self.base + pos
            self._op = buf[pos] if pos < len(buf) else 0
            if self.eof and _past_end(buf, pos, end):
                raise _Short() from None
            raise

    end_offset = 0

    def _fast_list(self, buf: bytes, pos: int, k: int) -> Tuple[Any, int]:
        """A list of frames (or a dropped list) read whole when it is a run of memo references:
        (the list, the position after it), or (None, pos) to read it opcode by opcode. The list
        read is a placeholder: the interned list is what its parent gets (see _intern)."""
        op = buf[pos]
        if op == 0x94:
            slot, p = -1, pos + 1
        elif op == 0x71:
            slot, p = buf[pos + 1], pos + 2
        elif op == 0x72:
            slot, p = _U4(buf, pos + 1)[0], pos + 5
        else:
            return None, pos
        run = None
        cands = self.by_prefix.get(buf[p: p + _PREFIX])
        if cands is not None:
            for i, r in enumerate(cands):
                if buf.startswith(r, p):  # the same bytes parse the same way
                    run = r
                    if i:
                        cands.insert(0, cands.pop(i))  # stacks come in streaks
                    break
        if run is None:
            run = _FRAMES_RUN.match(buf, p).group()  # type: ignore[union-attr]
            if len(run) >= _PREFIX:
                cands = self.by_prefix.setdefault(run[:_PREFIX], [])
                if len(cands) < 64:
                    cands.append(run)
        memo = self.memo
        if slot < 0:
            slot = len(memo)
            memo.append(GONE)
        else:
            picklerare.put(self, slot, GONE)
        self.kept += 8
        if k == DROPPED:
            return _Dropped(), p + len(run)
        res = self.runs.get(run)
        if res is None:
            res = self._run_list(run)
        after = p + len(run)
        if after < len(buf) and buf[after] in _CONSUMED:
            # What follows takes the list into its parent: complete, so the interned list itself.
            memo[slot] = res
            return res, after
        v: List[Any] = []
        self.fast[id(v)] = (res, slot)
        memo[slot] = v
        return v, p + len(run)


def read(f: BinaryIO, schema: Schema, limits: Optional[Limits] = None) -> Tuple[Any, Reader]:
    """The object pickled in `f`, kept by `schema`, and the reader (its `kept` estimate, the
    offset past STOP). Raises ReadError."""
    r = Reader(f, schema, limits)
    return r.read(), r
