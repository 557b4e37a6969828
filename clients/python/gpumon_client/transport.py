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
"""

import collections
import logging
import os
import random
import select
import socket
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from . import protocol
from .cadence import Throttle

log = logging.getLogger("gpumon_client")

DEFAULT_SOCKET = "/run/gpumon/ingest.sock"
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE as an error, never SIGPIPE
_CHUNK = 65536  # bytes joined per send() while draining a backlog
_FLUSH_BUDGET = 4 * _CHUNK  # bytes one send() call may write, so draining stays cheap per step
_READ_EVERY = 32  # sends between non-blocking reads of the daemon's replies
_MAX_REQUESTS = 8  # requests queued for the client; the daemon sends one at a time
_WATCH_EVERY = 0.25  # seconds between looks at the socket files while disconnected
_SEQ_ROOM = 24  # bytes `,"seq":N` adds to a line
# Answers belong to their connection: never numbered or resent.
_ANSWER = (b'{"type":"attribution"', b'{"type":"armed"', b'{"type":"peak"')


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


class Transport:
    """One connection's worth of state. Thread-safe; no method raises."""

    def __init__(
        self,
        hello: Callable[[], Dict[str, Any]],
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
    ) -> None:
        self._hello = hello
        # A client that takes requests (hello `caps`) reads at every send, so a request waits at
        # most one sample; others read every _READ_EVERY sends.
        self.read_every = max(1, int(read_every))
        self._paths = paths or socket_candidates
        self.max_lines = max(1, int(max_lines))
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._monotonic = monotonic
        self._wall = wall
        self.acks = acks
        self._instance = instance  # fixed only where output must be reproducible (fixtures)
        self._rng = random.Random() if jitter else None
        self._init_state()
        _live.add(self)

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._buf: Deque[Dict[str, Any]] = collections.deque()
        self._out = b""  # lines committed to the stream; never dropped
        self._off = 0  # how much of _out the kernel has taken
        self._delay = self.backoff_initial
        self._next_attempt = 0.0
        # The socket files as they were at the last failed attempt; a change means a daemon
        # (re)started, and the next send connects without waiting out the backoff.
        self._watched: Dict[str, Tuple[int, int]] = {}
        self._tried: List[str] = []
        self._next_watch = 0.0
        # Lines numbered (`seq`) and held until acknowledged, oldest first. Every connection
        # starts out keeping them; a welcome without `ack` (an older daemon) stops that.
        self.instance = self._instance or "%d-%s" % (os.getpid(), os.urandom(6).hex())
        self._seq = 0
        self._unacked: Deque[Tuple[int, bytes]] = collections.deque()
        self._acking = self.acks
        self.acked = 0  # the highest seq the daemon acknowledged
        self.unconfirmed = 0  # lines forgotten before an ack (the daemon may or may not have them)
        self.resent = 0  # lines sent again after a reconnect
        self._since_read = 0
        self._rx = b""
        # Requests from the daemon, (connection number, request), for the client to take at step
        # time. A request belongs to its connection: its id means nothing on the next one.
        self.requests: Deque[Tuple[int, protocol.AttributeRequest]] = collections.deque()
        self.arm_requests: Deque[Tuple[int, protocol.ArmRequest]] = collections.deque()
        self._closed = False
        # The daemon's line limit (welcome) and its rate_limited notices pace the samples.
        self.throttle = Throttle(self._monotonic)
        self.path: Optional[str] = None
        self.session: Optional[str] = None
        self.server: Optional[str] = None
        self.dropped = 0  # lines dropped since start
        self._unreported = 0  # dropped lines not yet told to the daemon
        self.connects = 0
        self.sent_lines = 0
        self.unencodable = 0
        self.internal_errors = 0
        self.bad_replies = 0  # daemon lines that were not JSON objects with a type, or unusable requests
        self.requests_dropped = 0
        self.errors: Dict[str, int] = {}
        self.last_error: Optional[str] = None

    # --- public, called from the training thread -------------------------------------------------

    def send(self, msg: Dict[str, Any]) -> None:
        """Queues a message and pushes what the socket takes now. Never blocks, never raises."""
        try:
            with self._lock:
                if self._closed:
                    return
                buf = self._buf
                if len(buf) >= self.max_lines:
                    buf.popleft()
                    self.dropped += 1
                    self._unreported += 1
                buf.append(msg)
                if self._sock is None:
                    now = self._monotonic()
                    if now < self._next_attempt and not self._socket_changed(now):
                        return
                    if not self._connect():
                        return
                self._flush()
        except Exception as exc:  # the trainer must never see our failures
            self._internal_error(exc)

    def send_answer(self, msg: Dict[str, Any], connection: int) -> bool:
        """Sends an answer to a request that came on connection number `connection` (`connects`
        when it arrived). An answer for an earlier connection is dropped: ids are per connection,
        so on a new one it would answer nothing, or the wrong request. Never raises."""
        try:
            with self._lock:
                if self._closed or self._sock is None or self.connects != connection:
                    return False
                self._buf.append(msg)
                self._flush()
                return True
        except Exception as exc:
            self._internal_error(exc)
            return False

    def close(self, bye: Optional[Dict[str, Any]] = None, timeout: float = 0.5) -> None:
        """Sends what is queued (and `bye`), waiting at most `timeout` seconds, then closes."""
        try:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
                if bye is not None:
                    self._buf.append(bye)
                if self._buf or self._out:
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
        return {
            "connected": self._sock is not None,
            "path": self.path,
            "session": self.session,
            "buffered": len(self._buf),
            "dropped": self.dropped,
            "connects": self.connects,
            "sent_lines": self.sent_lines,
            "errors": dict(self.errors),
            "last_error": self.last_error,
            "internal_errors": self.internal_errors,
            "bad_replies": self.bad_replies,
            "requests_dropped": self.requests_dropped,
            "max_lines_per_second": self.throttle.limit,
            "rate_skipped": self.throttle.skipped,
            "acked": self.acked,
            "unacked": len(self._unacked),
            "unconfirmed": self.unconfirmed,
            "resent": self.resent,
        }

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # --- internals, all called with the lock held ------------------------------------------------

    def _connect(self) -> bool:
        self._tried = self._paths()
        for path in self._tried:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(path)
            except OSError:
                # Absent, refused, or a full backlog (EAGAIN): all mean "not now".
                sock.close()
                continue
            self._sock = sock
            self.path = path
            self.connects += 1
            self.session = None
            hello = protocol.encode(self._hello_msg()) or b""
            if self._acking:
                # Everything not acknowledged goes again, in order (the line cut by the last
                # disconnect among it); the daemon drops what it already had. Unnumbered
                # answers to the last connection's requests mean nothing on this one.
                self.resent += len(self._unacked)
                self._out = hello + b"".join(line for _, line in self._unacked)
            else:
                # A line cut by the last disconnect goes again in full; the daemon drops half lines.
                start = self._out.rfind(b"\n", 0, self._off) + 1
                self._out = hello + self._out[start:]
            self._off = 0
            self._acking = self.acks
            log.debug("gpumon: connected to %s", path)
            return True
        self._schedule_retry()
        return False

    def _hello_msg(self) -> Dict[str, Any]:
        hello = self._hello()
        if not self.acks:
            return hello
        hello = dict(hello)
        hello["caps"] = list(hello.get("caps") or []) + [protocol.CAP_ACK]
        hello["instance"] = self.instance
        return hello

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

    def _schedule_retry(self) -> None:
        self._watched = self._stat_paths()
        delay = self._delay
        if self._rng is not None:
            delay *= self._rng.uniform(0.8, 1.2)  # spreads the ranks of a job apart
        self._next_attempt = self._monotonic() + delay
        self._delay = min(self._delay * 2, self.backoff_max)

    def _disconnect(self, retry: bool = True) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        self._rx = b""
        self.requests.clear()
        self.arm_requests.clear()
        if retry:
            self._schedule_retry()

    def _fill(self) -> None:
        lines = []
        size = 0
        buf = self._buf
        while size < _CHUNK:
            if self._unreported:
                # Dropped lines came from the head of the buffer, so the mark precedes what is left.
                line = protocol.encode(protocol.dropped_mark(self._wall(), self._unreported))
                self._unreported = 0
            elif buf:
                line = protocol.encode(buf.popleft())
            else:
                break
            if line is None:
                self.unencodable += 1
                continue
            if self._acking and len(line) + _SEQ_ROOM <= protocol.MAX_LINE and not line.startswith(_ANSWER):
                self._seq += 1
                line = b"%s,\"seq\":%d}\n" % (line[:-2], self._seq)
                held = self._unacked
                held.append((self._seq, line))
                if len(held) > self.max_lines:
                    held.popleft()
                    self.unconfirmed += 1
            lines.append(line)
            size += len(line)
        self._out = b"".join(lines)
        self._off = 0

    def _flush(self) -> None:
        budget = _FLUSH_BUDGET
        sock = self._sock
        while sock is not None and budget > 0:
            if self._off >= len(self._out):
                self._fill()
                if not self._out:
                    break
            data = self._out if self._off == 0 else self._out[self._off :]
            try:
                n = sock.send(data, _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                break  # the daemon is slow; what is queued waits for the next step
            except OSError as exc:
                log.debug("gpumon: connection lost: %s", exc)
                self._disconnect()
                return
            self.sent_lines += data.count(b"\n", 0, n)
            self._off += n
            budget -= n
            if n < len(data):
                break
        self._since_read += 1
        # Until the welcome arrives every send looks for it, so stats()["session"] is set early.
        if self._since_read >= self.read_every or self.session is None:
            self._since_read = 0
            self._read_replies()

    def _read_replies(self) -> None:
        # Replies are informational (the protocol says a client stays correct without them); reading
        # them notices a closed connection sooner and keeps the session id and error counts.
        sock = self._sock
        while sock is not None:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._disconnect()
                return
            if not data:
                self._disconnect()
                return
            self._rx += data
            *lines, self._rx = self._rx.split(b"\n")
            for line in lines:
                self._on_reply(line)
            if len(self._rx) > protocol.MAX_LINE:
                self._rx = b""

    def _on_reply(self, line: bytes) -> None:
        obj = protocol.parse_line(line)
        if obj is None:
            self.bad_replies += 1
            return
        if obj["type"] == "attribute":
            self._on_request(obj)
            return
        if obj["type"] in ("arm", "disarm"):
            self._on_arm(obj)
            return
        if obj["type"] == "ack":
            self._on_ack(obj.get("seq"))
            return
        reply = protocol.reply_of(obj)
        if reply.type == "welcome":
            self.session = reply.session
            self.server = reply.server
            self.throttle.set_limit(obj.get("max_lines_per_second"))
            if not obj.get("ack"):
                # This daemon does not acknowledge: holding lines for it would only fill up.
                self._acking = False
                self._unacked.clear()
            self._delay = self.backoff_initial  # a welcomed connection proves the daemon is healthy
        elif reply.type == "error":
            code = reply.code or "unknown"
            self.errors[code] = self.errors.get(code, 0) + 1
            if code == "rate_limited":
                self.throttle.limited()
            self.last_error = "%s: %s" % (code, reply.message or "")
            log.debug("gpumon: daemon error %s", self.last_error)

    def _on_ack(self, seq: Any) -> None:
        if not isinstance(seq, int) or isinstance(seq, bool):
            self.bad_replies += 1
            return
        held = self._unacked
        while held and held[0][0] <= seq:
            held.popleft()
        self.acked = max(self.acked, seq)

    def _on_request(self, obj: Dict[str, Any]) -> None:
        request = protocol.parse_request(obj)
        if request is None:
            self.bad_replies += 1  # no usable id: nothing could answer it
        elif len(self.requests) >= _MAX_REQUESTS:
            self.requests_dropped += 1
        else:
            self.requests.append((self.connects, request))

    def _on_arm(self, obj: Dict[str, Any]) -> None:
        request = protocol.parse_arm(obj)
        if request is None:
            self.bad_replies += 1
        elif len(self.arm_requests) >= _MAX_REQUESTS:
            self.requests_dropped += 1
        else:
            self.arm_requests.append((self.connects, request))

    def _drain(self, timeout: float) -> None:
        deadline = self._monotonic() + max(0.0, timeout)
        if self._sock is None and not self._connect():
            return
        while self._sock is not None and (self._buf or self._unreported or self._off < len(self._out)):
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
        self._init_state()
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
