"""Opening the connection to the daemon: where to look, and when to try again.

A failed attempt waits out a capped exponential backoff (jittered, so the ranks of a job spread
apart) before the next one, unless a socket file changes meanwhile: that is a daemon that
(re)started, and the next send connects at once.
"""

import os
import random
import socket
from typing import Callable, Dict, List, Mapping, Optional, Tuple

DEFAULT_SOCKET = "/run/gpumon/ingest.sock"
_WATCH_EVERY = 0.25  # seconds between looks at the socket files while disconnected


def socket_candidates(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """Where to look for the daemon, in the protocol's order."""
    env = os.environ if env is None else env
    explicit = env.get("GPUMON_SOCKET")
    if explicit:
        return [explicit]
    paths = [DEFAULT_SOCKET]
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        paths.append(os.path.join(runtime, "gpumon", "ingest.sock"))
    return paths


class Connector:
    """Connection attempts and the backoff between them. Not thread-safe: the transport holds
    its lock around every call."""

    def __init__(
        self,
        paths: Callable[[], List[str]],
        backoff_initial: float,
        backoff_max: float,
        monotonic: Callable[[], float],
        jitter: bool,
    ) -> None:
        self.paths = paths
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._monotonic = monotonic
        self._rng = random.Random() if jitter else None
        self.reset()

    def reset(self) -> None:
        """As new: the next attempt may go at once."""
        self.delay = self.backoff_initial
        self.next_attempt = 0.0
        # The socket files as they were at the last failed attempt; a change means a daemon
        # (re)started, and the next send connects without waiting out the backoff.
        self._watched: Dict[str, Tuple[int, int]] = {}
        self._tried: List[str] = []
        self._next_watch = 0.0

    def due(self, now: float) -> bool:
        """Whether to attempt a connection now (`now` from the monotonic clock)."""
        return now >= self.next_attempt or self._socket_changed(now)

    def open(self) -> Optional[Tuple[socket.socket, str]]:
        """A connected non-blocking socket and its path, or None (the next attempt scheduled)."""
        self._tried = self.paths()
        for path in self._tried:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(path)
            except OSError:
                # Absent, refused, or a full backlog (EAGAIN): all mean "not now".
                sock.close()
                continue
            return sock, path
        self.retry_later()
        return None

    def retry_later(self) -> None:
        """Schedules the next attempt, one backoff step later than the last."""
        self._watched = self._stat_paths()
        delay = self.delay
        if self._rng is not None:
            delay *= self._rng.uniform(0.8, 1.2)  # spreads the ranks of a job apart
        self.next_attempt = self._monotonic() + delay
        self.delay = min(self.delay * 2, self.backoff_max)

    def healthy(self) -> None:
        """A welcomed connection proves the daemon is healthy: the backoff starts over."""
        self.delay = self.backoff_initial

    def _stat_paths(self) -> Dict[str, Tuple[int, int]]:
        seen = {}
        for path in self._tried:
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen[path] = (st.st_ino, st.st_mtime_ns)
        return seen

    def _socket_changed(self, now: float) -> bool:
        # At most a few stat() calls a second while disconnected: far below a step's budget.
        if now < self._next_watch:
            return False
        self._next_watch = now + _WATCH_EVERY
        seen = self._stat_paths()
        return bool(seen) and seen != self._watched
