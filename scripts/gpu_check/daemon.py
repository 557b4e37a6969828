"""The gpumon daemon under test: started on a temporary socket and a free loopback port, with
--record-dir in the output directory, and read back over its HTTP API (stdlib urllib, every call
with a timeout)."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Tuple

from procs import Proc, Procs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(base: Dict[str, str]) -> Dict[str, str]:
    """The caller's environment without GPUMON_* settings, which would override our flags or
    point trainers at another daemon."""
    return {k: v for k, v in base.items() if not k.startswith("GPUMON_")}


class Daemon:
    def __init__(self, binary: str, workdir: str, out_dir: str, interval: str = "500ms", nvml_lib: Optional[str] = None) -> None:
        self.binary = binary
        self.socket = os.path.join(workdir, "ingest.sock")
        self.config = os.path.join(workdir, "gpumon.toml")
        self.record_dir = os.path.join(out_dir, "traces")
        self.log_path = os.path.join(out_dir, "logs", "daemon.log")
        self.interval = interval
        self.nvml_lib = nvml_lib
        self.port = 0
        self.proc: Optional[Proc] = None

    @property
    def base_url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def argv(self) -> list:
        argv = [
            self.binary,
            "daemon",
            "--config",
            self.config,  # empty: /etc/gpumon/gpumon.toml on the node must not change the test
            "--socket",
            self.socket,
            "--listen",
            "127.0.0.1:%d" % self.port,
            "--record-dir",
            self.record_dir,
            "--interval",
            self.interval,
            "--log-level",
            "info",
        ]
        if self.nvml_lib:
            argv += ["--nvml-lib", self.nvml_lib]
        return argv

    def start(self, procs: Procs, env: Dict[str, str], ready_timeout: float = 30.0) -> float:
        """Starts it and waits for /readyz; returns seconds to ready. Raises RuntimeError with the
        log's tail when it exits or does not get ready in time."""
        with open(self.config, "w") as f:
            f.write("# gpu-check: defaults only\n")
        os.makedirs(self.record_dir, exist_ok=True)
        t0 = time.monotonic()
        for attempt in range(3):  # a free port can be taken between finding and binding it
            self.port = free_port()
            self.proc = procs.start("daemon", self.argv(), self.log_path, env=clean_env(env))
            while time.monotonic() - t0 < ready_timeout:
                if self.proc.poll() is not None:
                    break
                status, _ = get(self.base_url + "/readyz", timeout=2.0)
                if status == 200:
                    return time.monotonic() - t0
                time.sleep(0.1)
            if self.proc.poll() is None:
                procs.stop(self.proc)
                raise RuntimeError("daemon not ready after %.0f s:\n%s" % (ready_timeout, self.proc.log_tail()))
            if "Address already in use" not in self.proc.log_tail(40) or attempt == 2:
                raise RuntimeError("daemon exited with status %s:\n%s" % (self.proc.poll(), self.proc.log_tail()))
        raise RuntimeError("daemon did not start")

    def snapshot(self, timeout: float = 5.0) -> Optional[Dict[str, Any]]:
        status, body = get(self.base_url + "/api/v1/snapshot", timeout=timeout)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def metrics(self, timeout: float = 5.0) -> Optional[str]:
        status, body = get(self.base_url + "/metrics", timeout=timeout)
        return body.decode("utf-8", "replace") if status == 200 else None


# Loopback only: an http_proxy in the environment must not see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float) -> Tuple[int, bytes]:
    """(HTTP status, body); status 0 when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""
