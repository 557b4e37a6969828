"""The reading half of the connection: the daemon's replies and requests.

Replies are informational (the protocol says a client stays correct without them); reading them
notices a closed connection sooner and keeps the session id, the error counts, the daemon's line
limit (for the Throttle) and its acknowledgements (for the Outbox). Requests (`attribute`, `arm`,
`disarm`) are queued, a few at most, for the client to take at step time.
"""

import collections
import logging
import socket
from typing import Any, Deque, Dict, Mapping, Optional, Tuple

from . import protocol
from .cadence import Throttle
from .connector import Connector
from .outbox import Outbox

log = logging.getLogger("gpumon_client")

_MAX_REQUESTS = 8  # requests queued for the client; the daemon sends one at a time


class Inbox:
    """Not thread-safe: the transport holds its lock around every call."""

    def __init__(self, outbox: Outbox, throttle: Throttle, connector: Connector) -> None:
        self._outbox = outbox
        self._throttle = throttle
        self._connector = connector
        self._rx = b""
        # Requests as (connection number, request). A request belongs to its connection: its id
        # means nothing on the next one.
        self.requests: Deque[Tuple[int, protocol.AttributeRequest]] = collections.deque()
        self.arm_requests: Deque[Tuple[int, protocol.ArmRequest]] = collections.deque()
        self.session: Optional[str] = None
        self.server: Optional[str] = None
        self.bad_replies = 0  # daemon lines that were not JSON objects with a type, or unusable requests
        self.requests_dropped = 0
        self.errors: Dict[str, int] = {}
        self.last_error: Optional[str] = None

    def read(self, sock: socket.socket, connection: int) -> bool:
        """Reads what the daemon sent, without blocking; `connection` numbers the connection the
        requests came on. False when the connection is closed or lost."""
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not data:
                return False
            self._rx += data
            *lines, self._rx = self._rx.split(b"\n")
            for line in lines:
                self._on_line(line, connection)
            if len(self._rx) > protocol.MAX_LINE:
                self._rx = b""

    def reset(self) -> None:
        """The connection ended: a half-read line and its requests go with it."""
        self._rx = b""
        self.requests.clear()
        self.arm_requests.clear()

    def _on_line(self, line: bytes, connection: int) -> None:
        obj = protocol.parse_line(line)
        if obj is None:
            self.bad_replies += 1
            return
        kind = obj["type"]
        if kind == "attribute":
            self._on_request(obj, connection)
        elif kind in ("arm", "disarm"):
            self._on_arm(obj, connection)
        elif kind == "ack":
            self._on_ack(obj.get("seq"))
        else:
            self._on_reply(obj)

    def _on_reply(self, obj: Mapping[str, Any]) -> None:
        reply = protocol.reply_of(obj)
        if reply.type == "welcome":
            self.session = reply.session
            self.server = reply.server
            self._throttle.set_limit(obj.get("max_lines_per_second"))
            if not obj.get("ack"):
                self._outbox.stop_acking()
            self._connector.healthy()
        elif reply.type == "error":
            code = reply.code or "unknown"
            self.errors[code] = self.errors.get(code, 0) + 1
            if code == "rate_limited":
                self._throttle.limited()
            self.last_error = "%s: %s" % (code, reply.message or "")
            log.debug("gpumon: daemon error %s", self.last_error)

    def _on_ack(self, seq: Any) -> None:
        if not isinstance(seq, int) or isinstance(seq, bool):
            self.bad_replies += 1
            return
        self._outbox.ack(seq)

    def _on_request(self, obj: Mapping[str, Any], connection: int) -> None:
        request = protocol.parse_request(obj)
        if request is None:
            self.bad_replies += 1  # no usable id: nothing could answer it
        elif len(self.requests) >= _MAX_REQUESTS:
            self.requests_dropped += 1
        else:
            self.requests.append((connection, request))

    def _on_arm(self, obj: Mapping[str, Any], connection: int) -> None:
        request = protocol.parse_arm(obj)
        if request is None:
            self.bad_replies += 1
        elif len(self.arm_requests) >= _MAX_REQUESTS:
            self.requests_dropped += 1
        else:
            self.arm_requests.append((connection, request))
