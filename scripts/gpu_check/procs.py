"""Processes gpu-check starts: each in its own process group (so torchrun's workers and any
dataloader workers go with it), output to a log file (never a pipe that could fill up), and every
one of them ended on the way out, whatever the way out is."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence


class Proc:
    def __init__(self, name: str, popen: "subprocess.Popen[bytes]", log_path: str) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.started = time.monotonic()
        self.timed_out = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def wait(self, timeout: float) -> Optional[int]:
        """The exit status, or None when it is still running after `timeout` seconds."""
        try:
            return self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Procs:
    """A registry of started processes; `stop_all` ends every one (group) that still runs."""

    def __init__(self) -> None:
        self.procs: List[Proc] = []

    def start(self, name: str, argv: Sequence[str], log_path: str, env: Dict[str, str], cwd: Optional[str] = None) -> Proc:
        log = open(log_path, "ab")
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # own process group: the whole tree can be signalled
            )
        finally:
            log.close()
        p = Proc(name, popen, log_path)
        self.procs.append(p)
        return p

    def stop(self, p: Proc, grace: float = 5.0, sig: int = signal.SIGTERM) -> Optional[int]:
        """SIGTERM to the group, SIGKILL after `grace` seconds; returns the exit status."""
        if p.poll() is None:
            _signal_group(p.pid, sig)
            if p.wait(grace) is None:
                _signal_group(p.pid, signal.SIGKILL)
                p.wait(5.0)
        else:
            # The leader is gone; workers it left in the group (torchrun's) may not be.
            _signal_group(p.pid, signal.SIGKILL)
        return p.poll()

    def stop_all(self, grace: float = 5.0) -> List[str]:
        """Ends everything still running, newest first (trainers before the daemon they talk to);
        returns the names of those that had to be ended."""
        ended = []
        for p in reversed(self.procs):
            running = p.poll() is None
            self.stop(p, grace)
            if running:
                ended.append(p.name)
        return ended

    def leftovers(self) -> List[int]:
        """Process groups of ours that still have a live member (should be none after stop_all)."""
        out = []
        for p in self.procs:
            try:
                os.killpg(p.pid, 0)
            except (ProcessLookupError, PermissionError):
                continue
            out.append(p.pid)
        return out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_all(procs: Sequence[Proc], timeout: float, poll: float = 0.2, tick=None) -> List[Proc]:
    """Waits until every process exited or `timeout` passed; `tick()` runs between polls.
    Returns the ones still running (the caller decides what to do with them)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [p for p in procs if p.poll() is None]
        if not running or time.monotonic() >= deadline:
            return running
        if tick is not None:
            tick()
        time.sleep(poll)
