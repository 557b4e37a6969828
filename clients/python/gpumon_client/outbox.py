"""The sending half of the connection: a bounded queue, the byte stream the socket is fed, and
the lines held until the daemon acknowledges them.

Backpressure never reaches the trainer: the queue keeps at most `max_lines` messages and drops
the oldest when full (counted in `dropped`, and told to the daemon in a `mark` ahead of what is
left), and `write` hands the socket only what it takes now, never waiting.

With capability `ack` every line after the hello is numbered (`seq`) and held, up to `max_lines`
of them, until the daemon acknowledges it; a new connection sends again whatever was not
acknowledged, and the daemon drops what it already had. Lines forgotten unacknowledged because
more than `max_lines` were held are counted in `unconfirmed`.
"""

import collections
import socket
from typing import Callable, Deque, List, Tuple

from . import protocol
from .messages import Message

_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE as an error, never SIGPIPE
_CHUNK = 65536  # bytes joined per send() while draining a backlog
_FLUSH_BUDGET = 4 * _CHUNK  # bytes one write() may hand the socket, so draining stays cheap per step
_SEQ_ROOM = 24  # bytes `,"seq":N` adds to a line
# Answers belong to their connection: never numbered or resent.
_ANSWER = (b'{"type":"attribution"', b'{"type":"armed"', b'{"type":"peak"')


class Outbox:
    """Not thread-safe: the transport holds its lock around every call."""

    def __init__(self, max_lines: int, wall: Callable[[], float], acks: bool) -> None:
        self.max_lines = max_lines
        self._wall = wall  # timestamps the `dropped` mark
        self.acks = acks
        self.queue: Deque[Message] = collections.deque()
        self.out = b""  # lines committed to the stream; never dropped
        self.off = 0  # how much of `out` the kernel has taken
        self.sent_lines = 0
        self.dropped = 0  # lines dropped since start
        self._unreported = 0  # dropped lines not yet told to the daemon
        self.unencodable = 0
        # Lines numbered and held until acknowledged, oldest first. Every connection starts out
        # keeping them; a welcome without `ack` (an older daemon) stops that.
        self._seq = 0
        self.held: Deque[Tuple[int, bytes]] = collections.deque()
        self.acking = acks
        self.acked = 0  # the highest seq the daemon acknowledged
        self.unconfirmed = 0  # lines forgotten before an ack (the daemon may or may not have them)
        self.resent = 0  # lines sent again after a reconnect

    def put(self, msg: Message) -> None:
        """Queues a message; when full, the oldest queued one is dropped for it."""
        queue = self.queue
        if len(queue) >= self.max_lines:
            queue.popleft()
            self.dropped += 1
            self._unreported += 1
        queue.append(msg)

    def put_unbounded(self, msg: Message) -> None:
        """Queues a message past the bound: answers and the bye, which are few and each owed."""
        self.queue.append(msg)

    def pending(self) -> bool:
        """Whether anything is left to write."""
        return bool(self.queue or self._unreported or self.off < len(self.out))

    def restart(self, hello: bytes) -> None:
        """A new connection: the stream starts over with `hello`, then what the last connection
        may not have delivered."""
        if self.acking:
            # Everything not acknowledged goes again, in order (the line cut by the last
            # disconnect among it); the daemon drops what it already had. Unnumbered answers to
            # the last connection's requests mean nothing on this one.
            self.resent += len(self.held)
            self.out = hello + b"".join(line for _, line in self.held)
        else:
            # A line cut by the last disconnect goes again in full; the daemon drops half lines.
            start = self.out.rfind(b"\n", 0, self.off) + 1
            self.out = hello + self.out[start:]
        self.off = 0
        self.acking = self.acks

    def write(self, sock: socket.socket) -> None:
        """Hands the socket what it takes now, at most _FLUSH_BUDGET bytes; never blocks. Raises
        OSError when the connection is lost."""
        budget = _FLUSH_BUDGET
        while budget > 0:
            if self.off >= len(self.out):
                self._fill()
                if not self.out:
                    return
            data = self.out if self.off == 0 else self.out[self.off :]
            try:
                n = sock.send(data, _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                return  # the daemon is slow; what is queued waits for the next step
            self.sent_lines += data.count(b"\n", 0, n)
            self.off += n
            budget -= n
            if n < len(data):
                return

    def ack(self, seq: int) -> None:
        """The daemon took every numbered line up to `seq`."""
        held = self.held
        while held and held[0][0] <= seq:
            held.popleft()
        self.acked = max(self.acked, seq)

    def stop_acking(self) -> None:
        """This daemon does not acknowledge: holding lines for it would only fill up."""
        self.acking = False
        self.held.clear()

    def _fill(self) -> None:
        lines: List[bytes] = []
        size = 0
        queue = self.queue
        while size < _CHUNK:
            if self._unreported:
                # Dropped lines came from the head of the queue, so the mark precedes what is left.
                line = protocol.encode(protocol.dropped_mark(self._wall(), self._unreported))
                self._unreported = 0
            elif queue:
                line = protocol.encode(queue.popleft())
            else:
                break
            if line is None:
                self.unencodable += 1
                continue
            if self.acking and len(line) + _SEQ_ROOM <= protocol.MAX_LINE and not line.startswith(_ANSWER):
                self._seq += 1
                line = b"%s,\"seq\":%d}\n" % (line[:-2], self._seq)
                held = self.held
                held.append((self._seq, line))
                if len(held) > self.max_lines:
                    held.popleft()
                    self.unconfirmed += 1
            lines.append(line)
            size += len(line)
        self.out = b"".join(lines)
        self.off = 0
