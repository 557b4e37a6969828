"""The connection to the daemon: a non-blocking Unix socket, a bounded buffer, capped backoff.

The rule this module exists for: the trainer's step never waits on the daemon. `send` runs on the
training thread, so it does no blocking syscall, keeps at most `max_lines` messages queued (the
oldest go first when full), and reconnects only when the backoff timer allows it, or at once when
the socket file changes (a restarted daemon).

Nothing is lost silently across a daemon restart (capability `ack`): every line after the hello
is numbered (`seq`), and a line stays held, up to `max_lines` of them, until the daemon
acknowledges it; after a reconnect whatever was never acknowledged goes again, and the daemon
drops what it already had. What the client gives up is counted: `dropped` (never sent) and
`unconfirmed` (sent, then forgotten unacknowledged when more than `max_lines` were held).

Transport holds the lock and the socket and joins the parts, each in its own module: Connector
(where and when to connect), Outbox (the queue, the stream and the held lines) and Inbox (the
daemon's replies and requests).
"""

import logging
import os
import select
import socket
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import protocol
from .cadence import Throttle
from .connector import DEFAULT_SOCKET, Connector, socket_candidates
from .inbox import Inbox
from .messages import Answer, Bye, Hello, Message
from .outbox import Outbox

__all__ = ["DEFAULT_SOCKET", "Transport", "socket_candidates"]

log = logging.getLogger("gpumon_client")

_READ_EVERY = 32  # writes between non-blocking reads of the daemon's replies
# Lines a sample may leave waiting before it is written anyway (or half of max_lines, when
# that is less): a high rate of explicit samples is written in batches, never dropped for waiting.
_WAIT_LINES = 64


class Transport:
    """One connection's worth of state. Thread-safe; no method raises."""

    def __init__(
        self,
        hello: Callable[[], Hello],
        paths: Optional[Callable[[], List[str]]] = None,
        max_lines: int = 1024,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        jitter: bool = True,
        read_every: int = _READ_EVERY,
        acks: bool = True,
        instance: Optional[str] = None,
        write_every: float = 0.0,
    ) -> None:
        self._hello = hello
        # Samples that may wait are written at most this often (seconds; 0: at once): see send.
        if isinstance(write_every, bool) or not isinstance(write_every, (int, float)) or not 0 <= write_every < 1e9:
            raise ValueError(
                "gpumon: write_every=%r: must be a number of seconds >= 0 (0 writes each sample at once)" % (write_every,)
            )
        self.write_every = float(write_every)
        # A client that takes requests (hello `caps`) reads at every write, so a request waits at
        # most one write (write_every); others read every _READ_EVERY writes.
        self.read_every = max(1, int(read_every))
        self._monotonic = monotonic
        self._wall = wall
        self.acks = acks
        self._instance = instance  # fixed only where output must be reproducible (fixtures)
        self._connector = Connector(paths or socket_candidates, backoff_initial, backoff_max, monotonic, jitter)
        self._init_state(max(1, int(max_lines)))
        _live.add(self)

    def _init_state(self, max_lines: int) -> None:
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._connector.reset()
        self._outbox = Outbox(max_lines, self._wall, self.acks)
        # The daemon's line limit (welcome) and its rate_limited notices pace the samples.
        self.throttle = Throttle(self._monotonic)
        self._inbox = Inbox(self._outbox, self.throttle, self._connector)
        # The inbox's queues, as attributes: the client tests them at every sample.
        self.requests: Deque[Tuple[int, protocol.AttributeRequest]] = self._inbox.requests
        self.arm_requests: Deque[Tuple[int, protocol.ArmRequest]] = self._inbox.arm_requests
        self.instance = self._instance or "%d-%s" % (os.getpid(), os.urandom(6).hex())
        self._since_read = 0
        self._last_write = -float("inf")
        self.writes = 0  # times the socket was written to (each a send syscall)
        self._closed = False
        self.path: Optional[str] = None
        self.connects = 0
        self.internal_errors = 0

    # --- public, called from the training thread -------------------------------------------------

    def send(self, msg: Message, may_wait: bool = False) -> None:
        """Queues a message and pushes what the socket takes now. Never blocks, never raises.

        may_wait (samples): the message may wait in the queue, up to `write_every` seconds after
        the last write, for the next one. On a training thread each write is a syscall that
        wakes the daemon and a read of its replies, and their cost to the loop lasts beyond the
        call; samples written in batches pay it once per batch. Anything that may not wait (an
        event, the bye) takes the waiting samples with it, in order, and the sample after it goes
        at once. Until the welcome arrives every sample goes at once, so a new session shows up at
        its first sample."""
        try:
            with self._lock:
                if self._closed:
                    return
                outbox = self._outbox
                outbox.put(msg)
                if (
                    may_wait
                    and self._sock is not None
                    and self._inbox.session is not None
                    and self._monotonic() - self._last_write < self.write_every
                    and len(outbox.queue) < _WAIT_LINES
                    and 2 * len(outbox.queue) < outbox.max_lines
                ):
                    return
                if self._sock is None:
                    if not self._connector.due(self._monotonic()):
                        return
                    if not self._connect():
                        return
                self._flush()
                if not may_wait:
                    # The sample after an event goes at once too: the daemon learns from it that
                    # a trainer survived its OOM, or what a new phase looks like, a step later.
                    self._last_write = -float("inf")
        except Exception as exc:  # the trainer must never see our failures
            self._internal_error(exc)

    def send_answer(self, msg: Answer, connection: int) -> bool:
        """Sends an answer to a request that came on connection number `connection` (`connects`
        when it arrived). An answer for an earlier connection is dropped: ids are per connection,
        so on a new one it would answer nothing, or the wrong request. Never raises."""
        try:
            with self._lock:
                if self._closed or self._sock is None or self.connects != connection:
                    return False
                self._outbox.put_unbounded(msg)
                self._flush()
                return True
        except Exception as exc:
            self._internal_error(exc)
            return False

    def send_now(self, msg: Message, timeout: float = 0.25) -> bool:
        """Sends `msg` and waits, at most `timeout` seconds, until it and everything queued before
        it are written: for a signal handler, whose process may die right after. The lock is
        taken with the same bound, so a handler that interrupted this thread inside `send`
        gives up rather than deadlock. False when it was not written. Never raises."""
        try:
            if not self._lock.acquire(timeout=max(0.0, timeout)):
                return False
            try:
                if self._closed:
                    return False
                self._outbox.put_unbounded(msg)
                self._drain(timeout)
                return self._sock is not None and not self._outbox.pending()
            finally:
                self._lock.release()
        except Exception as exc:
            self._internal_error(exc)
            return False

    def close(self, bye: Optional[Bye] = None, timeout: float = 0.5) -> None:
        """Sends what is queued (and `bye`), waiting at most `timeout` seconds, then closes."""
        try:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
                outbox = self._outbox
                if bye is not None:
                    outbox.put_unbounded(bye)
                if outbox.queue or outbox.out:
                    self._drain(timeout)
                self._disconnect(retry=False)
        except Exception as exc:
            self._internal_error(exc)

    def stats(self) -> Dict[str, Any]:
        if self.session is None and self._sock is not None:
            # The welcome may have arrived after the last send: look for it now (non-blocking).
            try:
                with self._lock:
                    self._read_replies()
            except Exception as exc:
                self._internal_error(exc)
        outbox, inbox = self._outbox, self._inbox
        return {
            "connected": self._sock is not None,
            "path": self.path,
            "session": inbox.session,
            "buffered": len(outbox.queue),
            "dropped": outbox.dropped,
            "connects": self.connects,
            "sent_lines": outbox.sent_lines,
            "writes": self.writes,
            "errors": dict(inbox.errors),
            "last_error": inbox.last_error,
            "internal_errors": self.internal_errors,
            "bad_replies": inbox.bad_replies,
            "requests_dropped": inbox.requests_dropped,
            "max_lines_per_second": self.throttle.limit,
            "rate_skipped": self.throttle.skipped,
            "acked": outbox.acked,
            "unacked": len(outbox.held),
            "unconfirmed": outbox.unconfirmed,
            "resent": outbox.resent,
        }

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # --- the parts' settings and counters, as attributes of the transport ------------------------

    @property
    def last_seq(self) -> int:
        """The `seq` of the last numbered line (0 before any: capability `ack` numbers them)."""
        return self._outbox._seq

    @property
    def max_lines(self) -> int:
        return self._outbox.max_lines

    @max_lines.setter
    def max_lines(self, value: int) -> None:
        self._outbox.max_lines = max(1, int(value))

    @property
    def backoff_initial(self) -> float:
        return self._connector.backoff_initial

    @backoff_initial.setter
    def backoff_initial(self, value: float) -> None:
        self._connector.backoff_initial = value

    @property
    def backoff_max(self) -> float:
        return self._connector.backoff_max

    @backoff_max.setter
    def backoff_max(self, value: float) -> None:
        self._connector.backoff_max = value

    @property
    def session(self) -> Optional[str]:
        return self._inbox.session

    @session.setter
    def session(self, value: Optional[str]) -> None:
        self._inbox.session = value

    @property
    def server(self) -> Optional[str]:
        return self._inbox.server

    @property
    def errors(self) -> Dict[str, int]:
        return self._inbox.errors

    @property
    def last_error(self) -> Optional[str]:
        return self._inbox.last_error

    @property
    def bad_replies(self) -> int:
        return self._inbox.bad_replies

    @property
    def requests_dropped(self) -> int:
        return self._inbox.requests_dropped

    @property
    def dropped(self) -> int:
        return self._outbox.dropped

    @property
    def sent_lines(self) -> int:
        return self._outbox.sent_lines

    @property
    def unencodable(self) -> int:
        return self._outbox.unencodable

    @property
    def acked(self) -> int:
        return self._outbox.acked

    @property
    def unconfirmed(self) -> int:
        return self._outbox.unconfirmed

    @property
    def resent(self) -> int:
        return self._outbox.resent

    # --- internals, all called with the lock held ------------------------------------------------

    def _connect(self) -> bool:
        opened = self._connector.open()
        if opened is None:
            return False
        self._sock, self.path = opened
        self.connects += 1
        self._inbox.session = None
        self._outbox.restart(protocol.encode(self._hello_msg()) or b"")
        log.debug("gpumon: connected to %s", self.path)
        return True

    def _hello_msg(self) -> Hello:
        hello = self._hello()
        if not self.acks:
            return hello
        hello = hello.copy()
        hello["caps"] = list(hello.get("caps") or []) + [protocol.CAP_ACK]
        hello["instance"] = self.instance
        return hello

    def _disconnect(self, retry: bool = True) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        self._inbox.reset()
        if retry:
            self._connector.retry_later()

    def _flush(self) -> None:
        sock = self._sock
        if sock is None:
            return
        if self.write_every:
            self._last_write = self._monotonic()
        self.writes += 1
        try:
            self._outbox.write(sock)
        except OSError as exc:
            log.debug("gpumon: connection lost: %s", exc)
            self._disconnect()
            return
        self._since_read += 1
        # Until the welcome arrives every send looks for it, so stats()["session"] is set early.
        if self._since_read >= self.read_every or self._inbox.session is None:
            self._since_read = 0
            self._read_replies()

    def _read_replies(self) -> None:
        sock = self._sock
        if sock is not None and not self._inbox.read(sock, self.connects):
            self._disconnect()

    def _drain(self, timeout: float) -> None:
        deadline = self._monotonic() + max(0.0, timeout)
        if self._sock is None and not self._connect():
            return
        outbox = self._outbox
        while self._sock is not None and outbox.pending():
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                return
            try:
                select.select([], [self._sock], [], remaining)
            except (OSError, ValueError):
                return
            self._flush()
        if self._sock is not None:
            self._read_replies()

    def _internal_error(self, exc: BaseException) -> None:
        self.internal_errors += 1
        if self.internal_errors == 1:
            log.warning("gpumon: client error (ignored, training continues): %r", exc)

    def _after_fork(self) -> None:
        # The child shares the parent's socket fd; writing to it would interleave lines. The
        # child starts over with its own connection (and its own hello) if it reports at all.
        sock = self._sock
        self._instance = None  # the child is another client: its own instance
        self._init_state(self.max_lines)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


_live: "weakref.WeakSet[Transport]" = weakref.WeakSet()


def _reset_in_child() -> None:
    for transport in list(_live):
        transport._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
