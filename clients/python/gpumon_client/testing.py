"""A stand-in for the gpumon daemon's ingest socket, for tests of code that uses the client.

It records every line it receives and answers like the protocol says (welcome after hello,
optionally an error for each later line). It can also be slow (accept, then not read) or be
stopped and started again on the same path to play a daemon restart.
"""

import json
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Union

from .snapsource import ReplaySnapshotSource, SnapshotSource, set_default_snapshots
from .stats import StatsSource, set_default_source


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.raw = bytearray()  # exactly the bytes received, for byte-for-byte comparisons

    @property
    def lines(self) -> List[bytes]:
        *complete, _ = bytes(self.raw).split(b"\n")
        return complete


class FakeDaemon:
    """A Unix-socket server at `path`. Use as a context manager or call start()/stop().

    welcome: reply `welcome` to a hello. error_code: reply an `error` with this code to every
    line after the hello. reading=False: accept connections but read nothing until
    resume_reading(), which fills the client's socket buffer like a stalled daemon. ack=True:
    answer a hello that lists the `ack` capability with `"ack":true` and acknowledge every
    numbered line, like the real daemon (the client then numbers every line, whenever the
    welcome arrives; without it, numbering stops at the welcome, wherever that falls).
    """

    def __init__(
        self,
        path: str,
        *,
        welcome: bool = True,
        error_code: Optional[str] = None,
        reading: bool = True,
        session: str = "s-1",
        ack: bool = False,
    ) -> None:
        self.path = path
        self.welcome = welcome
        self.ack = ack
        self.error_code = error_code
        self.session = session
        self.connections: List[_Conn] = []
        self._reading = threading.Event()
        if reading:
            self._reading.set()
        self._stop = threading.Event()
        self._listener: Optional[socket.socket] = None
        self._threads: List[threading.Thread] = []
        self._mutex = threading.Lock()

    def start(self) -> "FakeDaemon":
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._stop.clear()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        listener.settimeout(0.02)
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Closes the listener and every connection (the client sees the daemon go away)."""
        self._stop.set()
        self._reading.set()
        for t in self._threads:
            t.join(2.0)
        self._threads = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._mutex:
            for conn in self.connections:
                try:
                    conn.sock.close()
                except OSError:
                    pass
        if os.path.exists(self.path):
            os.unlink(self.path)

    def resume_reading(self) -> None:
        self._reading.set()

    def send(self, msg: Any, connection: int = -1) -> None:
        """Sends one line to a client (the latest connection by default): a dict is encoded as
        JSON, bytes go as they are (a newline is added when missing)."""
        line = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._mutex:
            conn = self.connections[connection]
        conn.sock.sendall(line)

    def attribute(self, id: int = 1, connection: int = -1, **fields: Any) -> None:
        """Sends an `attribute` request like the daemon's (steps 20, seconds 60, max_entries 4000,
        top 10 unless given)."""
        msg = {"type": "attribute", "v": 1, "id": id, "finding": "s-1/leak", "steps": 20, "seconds": 60,
               "max_entries": 4000, "top": 10}
        msg.update(fields)
        self.send(msg, connection)

    def __enter__(self) -> "FakeDaemon":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def lines(self) -> List[bytes]:
        with self._mutex:
            return [line for conn in self.connections for line in conn.lines]

    def messages(self) -> List[Dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def wait_for(self, count: int, timeout: float = 3.0, type: Optional[str] = None) -> List[Dict[str, Any]]:
        """Waits until `count` messages (of `type`, if given) arrived; returns all messages."""
        deadline = time.monotonic() + timeout
        while True:
            msgs = self.messages()
            have = len([m for m in msgs if type is None or m.get("type") == type])
            if have >= count or time.monotonic() > deadline:
                return msgs
            time.sleep(0.002)

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn = _Conn(sock)
            with self._mutex:
                self.connections.append(conn)
            self._spawn(self._serve, conn)

    def _serve(self, conn: _Conn) -> None:
        self._reading.wait()
        conn.sock.settimeout(0.02)
        pending = b""
        seen = 0
        while not self._stop.is_set():
            try:
                data = conn.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            with self._mutex:
                conn.raw += data
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                seen += 1
                self._reply(conn, line, seen)

    def _reply(self, conn: _Conn, line: bytes, number: int) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = {}
        if not isinstance(msg, dict):
            msg = {}
        kind = msg.get("type")
        out: Optional[Dict[str, Any]] = None
        if kind == "hello" and self.welcome:
            out = {"type": "welcome", "v": 1, "server": "gpumon-fake/0", "session": self.session}
            caps = msg.get("caps")
            if self.ack and isinstance(caps, list) and "ack" in caps:
                out["ack"] = True
        elif kind != "hello" and self.error_code:
            out = {"type": "error", "code": self.error_code, "line": number, "message": "fake daemon says no"}
        elif self.ack and isinstance(msg.get("seq"), int):
            out = {"type": "ack", "seq": msg["seq"]}
        if out is not None:
            try:
                conn.sock.sendall(json.dumps(out).encode() + b"\n")
            except OSError:
                pass


def use_source(source: Optional[StatsSource]) -> None:
    """Makes `source` the stats source that attach(), the launcher, Reporter and the trainer
    callbacks use when none is passed (None: torch.cuda again). For tests on machines without
    CUDA: the rest of torch stays real, only the allocator's numbers come from `source`. A
    `sitecustomize.py` that calls it applies it to `python -m gpumon_client run` unmodified."""
    set_default_source(source)


def use_snapshots(before: Union[None, str, SnapshotSource], after: Optional[str] = None) -> Optional[SnapshotSource]:
    """Makes attribution windows replay snapshot files instead of recording with torch.cuda:
    `before` and `after` (pickles of torch.cuda.memory._snapshot()) are handed out in turn, as
    the first and second snapshot of each window. Or pass a SnapshotSource; None: torch.cuda
    again. Clients created afterwards offer attribution (hello `caps`) whatever their stats
    source. Returns the source in use, whose `calls` show what the windows asked of it."""
    if before is None:
        set_default_snapshots(None)
        return None
    if isinstance(before, (str, os.PathLike)):
        if after is None:
            raise ValueError("use_snapshots(before, after): both snapshot files are needed")
        source: SnapshotSource = ReplaySnapshotSource(os.fspath(before), os.fspath(after))
    else:
        source = before
    set_default_snapshots(source)
    return source


_STAT_GROUPS = (
    "allocation", "segment", "active", "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
)


def nested_allocator_stats(allocated: int = 20 << 30, reserved: int = 24 << 30, retries: int = 0) -> Dict[str, Any]:
    """A dict shaped like `torch.cuda.memory_stats_as_nested_dict()` on a busy device (the
    caching allocator's ~130 counters), for tests and benches on machines without CUDA."""
    out: Dict[str, Any] = {}
    for i, group in enumerate(_STAT_GROUPS):
        scale = allocated if group in ("allocated_bytes", "active_bytes", "requested_bytes") else reserved
        if not group.endswith("bytes"):
            scale = 100 + i
        pools = {}
        for j, pool in enumerate(("all", "large_pool", "small_pool")):
            cur = scale >> j
            pools[pool] = {"current": cur, "peak": cur + (cur >> 3), "allocated": cur * 40, "freed": cur * 39}
        out[group] = pools
    out["inactive_split_bytes"]["all"]["current"] = reserved - allocated
    out.update(
        num_alloc_retries=retries, num_ooms=0, num_sync_all_streams=2, num_device_alloc=120, num_device_free=3,
        max_split_size=-1,
        oversize_allocations={"current": 0, "peak": 0, "allocated": 0, "freed": 0},
        oversize_segments={"current": 0, "peak": 0, "allocated": 0, "freed": 0},
    )
    return out
