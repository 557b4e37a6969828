"""What the streaming pickle reader keeps: a schema of kinds, compiled from a nested spec.

A spec says, for the places of a document, what to keep:

- ``KEEP``: the value as it is (any plain data; may be shared through the pickle's memo);
- ``DROP``: nothing (the opcodes are still read and checked, no object is built);
- ``FRAMES``: a list of frames, kept once per distinct list (interned): snapshots repeat the same
  stacks endlessly, so every copy after the first costs a reference;
- ``{"key": spec, ..., "*": KEEP or DROP}``: a dict, its listed keys read by their spec, the others
  by ``"*"`` (default KEEP);
- ``[spec]``: a list whose every element is read by ``spec``.

Dicts and lists named by a spec are *structural*: each is built once where it stands, never shared
through the memo (a torch snapshot never shares a segment, block or history entry), which is what
bounds the work a consumer does on them by the bytes kept.
"""

from typing import Any, Dict, List, Optional

__all__ = ["KEEP", "DROP", "FRAMES", "OTHER", "DROPPED", "Schema"]

KEEP = "keep"
DROP = "drop"
FRAMES = "frames"

# Kind numbers: 0 and 1 are fixed, the spec's kinds follow.
OTHER = 0  # kept as plain data, shareable
DROPPED = 1  # not built


class Schema:
    """Tables the reader looks kinds up in, by kind number."""

    def __init__(self, spec: Any, name: str = "schema") -> None:
        self.name = name
        self.ctype: List[Optional[type]] = [None, None]  # dict or list for structural kinds
        self.keys: List[Optional[Dict[Any, int]]] = [None, None]  # dict kinds: key -> kind
        self.default: List[int] = [OTHER, DROPPED]  # dict kinds: kind of unlisted keys
        self.elem: List[int] = [OTHER, DROPPED]  # list kinds: kind of elements
        self.shareable: List[bool] = [True, True]
        self.labels: List[str] = ["data", "dropped"]
        self.frames = -1  # the FRAMES kind, when the spec has one
        self.root = self._compile(spec, "root")

    def _new(self, ctype: Optional[type], label: str, shareable: bool = False) -> int:
        self.ctype.append(ctype)
        self.keys.append(None)
        self.default.append(OTHER)
        self.elem.append(OTHER)
        self.shareable.append(shareable)
        self.labels.append(label)
        return len(self.ctype) - 1

    def _compile(self, spec: Any, label: str) -> int:
        if spec == KEEP:
            return OTHER
        if spec == DROP:
            return DROPPED
        if spec == FRAMES:
            if self.frames < 0:
                self.frames = self._new(list, "frames list", shareable=True)
            return self.frames
        if isinstance(spec, dict):
            k = self._new(dict, label)
            keys: Dict[Any, int] = {}
            for key, sub in spec.items():
                if key == "*":
                    if sub not in (KEEP, DROP):
                        raise ValueError("'*' is KEEP or DROP")
                    self.default[k] = OTHER if sub == KEEP else DROPPED
                else:
                    keys[key] = self._compile(sub, str(key))
            self.keys[k] = keys
            return k
        if isinstance(spec, list) and len(spec) == 1:
            k = self._new(list, label + " list")
            self.elem[k] = self._compile(spec[0], label)
            return k
        raise ValueError("not a spec: %r" % (spec,))

    def child(self, kind: int, key: Any) -> int:
        """The kind of the value under `key` in a dict of `kind`."""
        keys = self.keys[kind]
        if keys is None:
            return kind if kind == DROPPED else OTHER
        try:
            return keys.get(key, self.default[kind])
        except TypeError:  # an unhashable key: the dict will refuse it anyway
            return self.default[kind]

    def item(self, kind: int) -> int:
        """The kind of an element of a list of `kind`."""
        if kind == DROPPED:
            return DROPPED
        return self.elem[kind] if self.ctype[kind] is list and kind != self.frames else OTHER

    def fit(self, kind: int, ctype: type) -> int:
        """`kind` for a container of `ctype`: a structural kind of another type reads as plain
        data (the consumer's own checks then say what is wrong with it)."""
        if kind <= DROPPED or self.ctype[kind] is ctype:
            return kind
        return OTHER
