"""What gpu-check observes while trainers run, gathered between waits (`tick()`), never blocking
for long: the daemon's snapshot and /metrics every half second, nvidia-smi against the daemon's
per-process memory every few seconds, and the bare NVML poll for comparison."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any, Dict, List, Optional

import analysis
from daemon import Daemon

SESSION_KEYS = (
    "session", "pid", "job", "rank", "world_size", "gpu_uuid", "gpu", "nvml", "torch", "samples",
    "step", "phase", "started", "last_sample_ts", "ended", "alloc_retries_total", "ooms_total",
    "device_total", "device_free", "alloc_limit",
    # The memory split and the batch predicted to fit (the batch_fit check).
    "categories", "largest_safe_batch", "batch_fit",
)


# Ended sessions and resolved findings stay in every snapshot for a long while; each is kept in
# the history only this long after it ended, which is enough for its last view to be in there.
KEEP_ENDED_S = 10.0


def _recent(ts: float, ended: Any) -> bool:
    return ended is None or ts - float(ended) <= KEEP_ENDED_S


def compact(snap: Dict[str, Any]) -> Dict[str, Any]:
    """The parts of a snapshot the checks read: sessions without their series, and sessions and
    findings that ended long ago left out (the history stays small over a long run)."""
    ts = float(snap.get("ts") or 0.0)
    return {
        "ts": snap.get("ts"),
        "version": snap.get("version"),
        "nvml": snap.get("nvml"),
        "gpus": [
            {k: g.get(k) for k in ("index", "uuid", "name", "memory", "state")} for g in snap.get("gpus") or []
        ],
        "processes": [
            {k: p.get(k) for k in ("pid", "gpu", "uuid", "mig_uuid", "kind", "used_memory_bytes", "name")}
            for p in snap.get("processes") or []
        ],
        "sessions": [
            dict({k: s.get(k) for k in SESSION_KEYS}, stats=s.get("stats"), events=(s.get("events") or [])[-5:])
            for s in snap.get("sessions") or []
            if _recent(ts, (s.get("ended") or [None])[0])
        ],
        "findings": [f for f in snap.get("findings") or [] if _recent(ts, f.get("resolved_ts"))],
    }


class Monitor:
    def __init__(self, daemon: Daemon, smi: Optional[List[str]], bare: Any, history_path: Optional[str] = None) -> None:
        self.daemon = daemon
        self.smi = smi  # the nvidia-smi command, or None when there is none
        self.bare = bare  # nvml_bare.BareNvml, or None when NVML could not be loaded here
        self.history: List[Dict[str, Any]] = []
        self.last_full: Optional[Dict[str, Any]] = None
        self.metric_polls: List[tuple] = []
        self.bare_polls: List[float] = []
        self.comparisons: List[Dict[str, Any]] = []
        self.smi_errors: List[str] = []
        self.bare_error: Optional[str] = None
        self.compare = False  # set while trainers run
        self.history_path = history_path
        self._next = {"snap": 0.0, "smi": 0.0, "bare": 0.0}

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next["snap"]:
            self._next["snap"] = now + 0.5
            self.observe()
        if self.bare is not None and now >= self._next["bare"]:
            self._next["bare"] = now + 2.0
            try:
                self.bare_polls.append(self.bare.poll())
            except Exception as exc:  # stop timing, keep checking
                self.bare_error = "bare NVML poll failed: %r" % (exc,)
                self.bare = None
        if self.compare and self.smi and now >= self._next["smi"]:
            self._next["smi"] = now + 3.0
            self.compare_once()

    def observe(self) -> Optional[Dict[str, Any]]:
        snap = self.daemon.snapshot()
        if snap is not None:
            self.last_full = snap
            c = compact(snap)
            self.history.append(c)
            if self.history_path:
                with open(self.history_path, "a") as f:
                    f.write(json.dumps(c) + "\n")
        text = self.daemon.metrics()
        if text is not None:
            m = analysis.parse_metrics(text)
            self.metric_polls.append(
                (
                    analysis.metric_value(m, "gpumon_nvml_polls_total"),
                    analysis.metric_value(m, "gpumon_nvml_poll_duration_seconds"),
                )
            )
        return snap

    def compare_once(self) -> None:
        """One nvidia-smi reading between two daemon snapshots, the second taken after the
        daemon's next poll, so the smi reading falls between two daemon polls."""
        before = self.daemon.snapshot()
        if before is None:
            return
        try:
            r = subprocess.run(
                self.smi + ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=20,
            )
            if r.returncode != 0:
                raise RuntimeError("exit %d: %s" % (r.returncode, r.stderr.decode("utf-8", "replace").strip()[:200]))
            rows = analysis.parse_smi_compute_apps(r.stdout.decode("utf-8", "replace"))
        except Exception as exc:
            self.smi_errors.append("nvidia-smi: %s" % (exc,))
            return
        after_poll = time.time()
        after = None
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            after = self.daemon.snapshot()
            if after is not None and ((after.get("nvml") or {}).get("last_poll_ts") or 0) > after_poll:
                break
            after = None
            time.sleep(0.1)
        if after is None:
            return
        gpu_uuid = self.gpu_uuid(after)
        if gpu_uuid is None:
            return
        for c in analysis.compare_process_memory(before, rows, after, gpu_uuid):
            c["ts"] = after.get("ts")
            self.comparisons.append(c)

    @staticmethod
    def gpu_uuid(snap: Dict[str, Any]) -> Optional[str]:
        """GPU 0 as the trainers see it: the device of a live session, else NVML's first GPU."""
        for s in snap.get("sessions") or []:
            if not s.get("ended") and s.get("gpu_uuid"):
                return s["gpu_uuid"]
        gpus = snap.get("gpus") or []
        return gpus[0].get("uuid") if gpus else None
