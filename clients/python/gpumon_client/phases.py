"""The trainer's current phase ("train", "eval", ...), process-wide, and the phase() context manager."""

import contextlib
from typing import Callable, Iterator, List

_current = "train"
# Called with the new phase at each change (the client sends it as an event).
_listeners: List[Callable[[str], None]] = []


def listen(callback: Callable[[str], None]) -> None:
    _listeners.append(callback)


def current() -> str:
    return _current


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks the samples taken inside the block with `name` and sends `phase` events at both edges.

    The daemon judges memory growth on train samples only, so wrapping evaluation keeps its
    temporary allocations from looking like a leak. Nesting restores the outer phase on exit.
    """
    previous = _current
    _set(str(name))
    try:
        yield
    finally:
        _set(previous)


def _set(name: str) -> None:
    global _current
    if name == _current:
        return
    _current = name
    for callback in _listeners:
        callback(name)
