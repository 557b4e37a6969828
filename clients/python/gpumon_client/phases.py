"""The trainer's current phase ("train", "eval", ...), process-wide, and the phase() context manager."""

import contextlib
from typing import Iterator

_current = "train"


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
    from .client import _broadcast_phase  # late: client imports this module

    _broadcast_phase(name)
