"""The NVML calls the daemon makes in one poll (src/sources/nvml.rs), made bare through ctypes
(no pynvml needed), to compare the daemon's poll duration against. Also times `nvidia-smi` and,
when installed, pynvml doing the same, for context.

Identity (UUID, name, PCI) and process names are cached by the daemon after the first poll, so
they are left out here too.
"""

from __future__ import annotations

import ctypes
import importlib.util
import subprocess
import time
from typing import Any, Callable, List, Optional

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
# nvmlProcessInfo_t is 24 bytes in every header the daemon supports; the buffer leaves room for
# twice that per entry so that a driver with a larger struct cannot write past it.
_PROC_SLOT = 48


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class BareNvml:
    """libnvidia-ml loaded with ctypes; `poll()` does one poll's worth of calls for every GPU."""

    def __init__(self, lib: str = "libnvidia-ml.so.1") -> None:
        self.lib = ctypes.CDLL(lib)
        rc = self.lib.nvmlInit_v2()
        if rc != NVML_SUCCESS:
            raise RuntimeError("nvmlInit_v2 returned %d" % rc)
        self.processes_seen = 0
        # _v3 where the driver has it (what nvml-wrapper calls), else _v2: the same 24-byte entries.
        self.compute_fn = self._symbol("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
        self.graphics_fn = self._symbol("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2")

    def _symbol(self, *names: str) -> Callable[..., int]:
        for name in names:
            fn = getattr(self.lib, name, None)
            if fn is not None:
                return fn
        raise RuntimeError("the NVML library has none of %s" % ", ".join(names))

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except Exception:
            pass

    def count(self) -> int:
        n = ctypes.c_uint(0)
        rc = self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
        if rc != NVML_SUCCESS:
            raise RuntimeError("nvmlDeviceGetCount_v2 returned %d" % rc)
        return n.value

    def poll(self) -> float:
        """One poll over every GPU; returns its duration in seconds."""
        lib = self.lib
        t0 = time.perf_counter()
        seen = 0
        for i in range(self.count()):
            dev = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(dev)) != NVML_SUCCESS:
                continue
            mem, util, uint, uint2 = _Memory(), _Utilization(), ctypes.c_uint(), ctypes.c_uint()
            lib.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem))
            lib.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(util))
            lib.nvmlDeviceGetTemperature(dev, ctypes.c_int(0), ctypes.byref(uint))
            lib.nvmlDeviceGetPowerUsage(dev, ctypes.byref(uint))
            lib.nvmlDeviceGetMigMode(dev, ctypes.byref(uint), ctypes.byref(uint2))
            seen += self._list(self.compute_fn, dev)
            seen += self._list(self.graphics_fn, dev)
        elapsed = time.perf_counter() - t0
        self.processes_seen = seen
        return elapsed

    @staticmethod
    def _list(fn: Callable[..., int], dev: Any) -> int:
        # As nvml-wrapper does it: ask for the count, then fetch with a little slack.
        count = ctypes.c_uint(0)
        rc = fn(dev, ctypes.byref(count), None)
        if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE) or count.value == 0:
            return 0
        cap = count.value + 5
        buf = ctypes.create_string_buffer(cap * _PROC_SLOT)
        count = ctypes.c_uint(cap)
        if fn(dev, ctypes.byref(count), buf) != NVML_SUCCESS:
            return 0
        return count.value


def compute_processes(nvml: BareNvml) -> List[tuple]:
    """(pid, GPU UUID, used bytes or None) of every compute process: what nvidia-smi
    --query-compute-apps lists. Used by the self-test's stand-in for nvidia-smi."""
    lib, out = nvml.lib, []
    for i in range(nvml.count()):
        dev = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(dev)) != NVML_SUCCESS:
            continue
        uuid = ctypes.create_string_buffer(96)
        lib.nvmlDeviceGetUUID(dev, uuid, ctypes.c_uint(96))
        count = ctypes.c_uint(64)
        buf = ctypes.create_string_buffer(64 * _PROC_SLOT)
        if nvml.compute_fn(dev, ctypes.byref(count), buf) != NVML_SUCCESS:
            continue
        for k in range(count.value):
            # nvmlProcessInfo_t: pid (u32), 4 bytes padding, usedGpuMemory (u64), two u32 ids.
            pid = ctypes.c_uint.from_buffer(buf, 24 * k).value
            used = ctypes.c_ulonglong.from_buffer(buf, 24 * k + 8).value
            out.append((pid, uuid.value.decode(), None if used == (1 << 64) - 1 else used))
    return out


def time_bare(lib: str, polls: int) -> List[float]:
    nvml = BareNvml(lib)
    try:
        nvml.poll()  # the first call of each kind is slower (lazy driver state)
        return [nvml.poll() for _ in range(polls)]
    finally:
        nvml.close()


def time_command(argv: List[str], runs: int, timeout: float = 30.0) -> List[float]:
    """Wall time of a command, each run; a run that fails or times out stops the series."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            break
        if r.returncode != 0:
            break
        out.append(time.perf_counter() - t0)
    return out


def pynvml_available() -> bool:
    return importlib.util.find_spec("pynvml") is not None


def time_pynvml(polls: int) -> Optional[List[float]]:
    """The same calls through pynvml (nvidia-ml-py), when it is installed; None otherwise."""
    if not pynvml_available():
        return None
    import pynvml  # noqa: optional, only timed when present

    pynvml.nvmlInit()
    try:
        def one() -> float:
            t0 = time.perf_counter()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                for call in (
                    lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
                    lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
                    lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
                    lambda: pynvml.nvmlDeviceGetPowerUsage(h),
                    lambda: pynvml.nvmlDeviceGetMigMode(h),
                    lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
                    lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
                ):
                    try:
                        call()
                    except pynvml.NVMLError:
                        pass
            return time.perf_counter() - t0

        one()
        return [one() for _ in range(polls)]
    finally:
        pynvml.nvmlShutdown()
