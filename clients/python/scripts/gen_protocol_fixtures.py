#!/usr/bin/env python3
"""Writes the golden protocol fixtures: tests/fixtures/protocol/client_*.jsonl at the repo root.

Each file is one connection's bytes exactly as the Python client sent them, captured by a real
Unix-socket server (so framing is included), with a fixed clock and pid so the output is stable.
The Rust daemon's tests parse these files; the client's tests fail if its output drifts from them.

    python3 clients/python/scripts/gen_protocol_fixtures.py          # rewrite the fixtures
    python3 clients/python/scripts/gen_protocol_fixtures.py --check  # exit 1 if they differ
"""

import contextlib
import os
import select
import shutil
import sys
import tempfile
from typing import Callable, Dict, Iterator, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gpumon_client import Client, StaticStatsSource, _env, categories, oomreport, phase, protocol  # noqa: E402
from gpumon_client.snapshot import load as snapload  # noqa: E402
from gpumon_client.snapsource import ReplaySnapshotSource  # noqa: E402
from gpumon_client.testing import FakeDaemon  # noqa: E402

FIXTURE_DIR = os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "protocol")
SNAPSHOTS = os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-snapshots")
OOMS = os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-oom")

# The client's instance id is random per process; the fixtures pin one.
FIXED_INSTANCE = "4242-5f1a2b3c4d5e"

# Values from the protocol document's examples.
STATS = {
    "allocated_bytes.all.current": 21474836480,
    "allocated_bytes.all.peak": 30064771072,
    "reserved_bytes.all.current": 32212254720,
    "active_bytes.all.current": 21474836480,
    "inactive_split_bytes.all.current": 268435456,
    "requested_bytes.all.current": 21400000000,
    "num_alloc_retries": 0,
    "num_ooms": 0,
    "num_sync_all_streams": 0,
    "num_device_alloc": 120,
    "num_device_free": 3,
}
# Keys the daemon does not know: a client with stats_keys=None sends them and the daemon must ignore them.
EXTRA_STATS = {
    "allocated_bytes.small_pool.current": 1048576,
    "allocation.all.current": 812,
    "oversize_allocations.current": 0,
    "max_split_size": -1,
}
MEM_INFO = (47244640256, 85520809984)
DEVICE = {
    "cuda_device": 0,
    "gpu_uuid": "GPU-8f0c3e1a-5b2d-4c6e-9a7f-0123456789ab",
    "torch": "2.5.1",
    "allocator": "native",
    "expandable_segments": False,
}


def _clock(start: float = 1763700000.0, tick: float = 0.25) -> Callable[[], float]:
    # Quarter seconds are exact in binary, so timestamps print the same everywhere.
    state = {"t": start - tick}

    def now() -> float:
        state["t"] += tick
        return state["t"]

    return now


def _session(path: str) -> None:
    c = Client("llama-ft", source=StaticStatsSource(STATS, MEM_INFO, DEVICE), socket=path, rank=0,
               world_size=8, clock=_clock(), pid=4242, jitter=False, instance=FIXED_INSTANCE)
    c.sample(step=1)
    c.sample(step=2)
    with phase("eval"):
        c.sample(step=2)
    c.mark("lr decay to 1e-5")
    c.snapshot("/var/lib/gpumon/snapshots/rank0-step2.pickle")
    c.oom(2147483648, device_free=104857600, device=0)
    c.sample(step=3)
    c.close(timeout=2.0)


def _minimal(path: str) -> None:
    # No device info, no labels, no mem_get_info, no step: every optional field left out.
    stats = dict(STATS, **EXTRA_STATS)
    c = Client(source=StaticStatsSource(stats), socket=path, stats_keys=None, clock=_clock(1763700300.0),
               pid=17, jitter=False, instance=FIXED_INSTANCE)
    c.sample()
    c.close(timeout=2.0)


def _capped(path: str) -> None:
    # A trainer on a shared GPU: set_per_process_memory_fraction(0.0594) caps the allocator at
    # 4.73 GiB of the 79.6 GiB device, then the trainer raises the cap; it OOMs against the cap.
    stats = dict(STATS, **{"allocated_bytes.all.current": 4500000000, "allocated_bytes.all.peak": 4950000000,
                           "reserved_bytes.all.current": 4980000000, "active_bytes.all.current": 4500000000,
                           "requested_bytes.all.current": 4490000000, "num_alloc_retries": 7})
    source = StaticStatsSource(stats, (75000000000, 85520809984), dict(DEVICE, alloc_limit=5080000000))
    c = Client("shared-ft", source=source, socket=path, clock=_clock(1763700200.0), pid=4343, jitter=False, instance=FIXED_INSTANCE)
    c._monotonic = _clock(100.0, tick=0.5)  # device info and the cap are re-read once a second
    c.sample(step=1)
    c.sample(step=2)
    source.info["alloc_limit"] = 6000000000
    c.sample(step=3)
    c.sample(step=4)
    c.oom(402653184, device_free=75000000000, device=0, limit=6000000000)
    c.close(timeout=2.0)


GiB = 1 << 30


def _categories(path: str) -> None:
    # A Megatron-style trainer of 1.07e9 parameters: bf16 weights (2 GiB), fp32 main_grad
    # (4 GiB), Adam's two fp32 moments (8 GiB); its fp32 master weights are no module's
    # parameters nor optimizer state, so they fall in the rest. Step 3 carries the split, the
    # rare measured step: 2 + 4 + 8 + 6 GiB named under the stats' allocated peak of 28 GiB, so
    # 8 GiB other. Of the parameters and gradients only main_grad is float32: fp32_bytes is its
    # 4 GiB. The reason is the one categories.py writes for main_grad, with its code.
    split = protocol.categories(
        3,
        parameters_bytes=2 * GiB,
        gradients_bytes=4 * GiB,
        optimizer_state_bytes=8 * GiB,
        buffers_bytes=1048576,
        activations_bytes=6 * GiB - 1048576,
        batch_size=16,
        fp32_bytes=4 * GiB,
        partial=["%s: 291 parameters keep their gradient in main_grad (Megatron): counted from it, the whole "
                 "gradient buffer once" % categories.PARTIAL_MAIN_GRAD],
    )
    c = Client("megatron-ft", source=StaticStatsSource(STATS, MEM_INFO, DEVICE), socket=path, rank=0,
               world_size=8, clock=_clock(1763700500.0), pid=4545, jitter=False, instance=FIXED_INSTANCE)
    c.sample(step=2)
    c.sample(step=3, categories=split)
    c.sample(step=4)
    c.close(timeout=2.0)


def _reconnect(path: str) -> Dict[str, object]:
    # The daemon is down for steps 1-6 with room for 4 lines; it is up for step 7.
    c = Client("llama-ft", source=StaticStatsSource(STATS, MEM_INFO, DEVICE), socket=path, rank=0,
               world_size=8, clock=_clock(1763700100.0), pid=4242, jitter=False, instance=FIXED_INSTANCE, max_buffer=4, backoff_initial=0.0)
    for step in range(1, 7):
        c.sample(step=step)
    return {"client": c}


def _until_readable(client: Client) -> None:
    # The request is read at the next sample; wait until it is there, so the bytes are stable.
    sock = client.transport._sock
    if sock is None or not select.select([sock], [], [], 5.0)[0]:
        raise RuntimeError("the request did not reach the client")


def _attribution(path: str, daemon: FakeDaemon) -> None:
    # A trainer that offers attribution (hello `caps`). The daemon asks twice: the first window
    # runs its 3 steps and is answered with sites (the H100 snapshots of a trainer that keeps every
    # step's output, replayed); the second is still open when the trainer stops: cut_short.
    snapshots = ReplaySnapshotSource(
        os.path.join(SNAPSHOTS, "leak-kept-outputs-step60.pickle"),
        os.path.join(SNAPSHOTS, "leak-kept-outputs-step180.pickle"),
    )
    c = Client("llama-ft", source=StaticStatsSource(STATS, MEM_INFO, DEVICE), socket=path, rank=0, world_size=8,
               clock=_clock(1763700300.0), pid=4242, jitter=False, instance=FIXED_INSTANCE, attribution=snapshots, write_every=0)
    c.attributor._monotonic = _clock(500.0, tick=0.5)
    c.sample(step=610)
    daemon.wait_for(2)
    daemon.attribute(id=1, finding="s-1/leak", steps=3, seconds=120)
    _until_readable(c)
    c.sample(step=611)  # takes the request: recording starts
    for step in range(612, 616):  # 612: the first snapshot; 615: the second, and the answer
        c.at_step(step)
        c.sample(step=step)
    daemon.attribute(id=2, finding="s-1/leak", steps=3, seconds=120)
    _until_readable(c)
    c.sample(step=616)
    c.at_step(617)
    c.close(timeout=2.0)


def _oom_explained(path: str, daemon: FakeDaemon) -> None:
    # A capped trainer that offers OOM history: the daemon arms it (near_limit), it records and
    # sends the step peak after 2 recorded steps, then runs out of memory; its OOM observer
    # explains the OOM from the snapshot (the H100 fragmentation OOM, replayed); it survives.
    frag = os.path.join(OOMS, "fragmentation.pickle")
    snapshots = ReplaySnapshotSource(frag, frag)
    source = StaticStatsSource(STATS, MEM_INFO, dict(DEVICE, alloc_limit=4294967296))
    c = Client("frag-ft", source=source, socket=path, clock=_clock(1763700400.0), pid=4444, jitter=False,
               instance=FIXED_INSTANCE, attribution=snapshots, write_every=0)
    c.sample(step=100)
    daemon.wait_for(2)
    daemon.send({"type": "arm", "v": 1, "id": 1, "finding": "s-1/near_limit", "seconds": 900,
                 "max_entries": 20000, "peak_after_steps": 2})
    _until_readable(c)
    c.sample(step=101)  # takes the request: recording starts, `armed` answers
    for step in range(102, 105):  # 102: the first recorded step; 104: the peak is sent
        c.at_step(step)
        c.sample(step=step)
    explanation = oomreport.at_oom(0, 1610612736, 4294967296, snapshot=lambda: snapload.load(frag))
    c.oom(1610612736, device_free=80386129920, device=0, limit=4294967296, explanation=explanation)
    c.sample(step=105)  # the run went on
    c.close(timeout=2.0)


def _stopped(path: str) -> None:
    # SIGTERM (scancel, preemption): the handler's line, then the process dies without bye.
    c = Client("llama-ft", source=StaticStatsSource(STATS, MEM_INFO, DEVICE), socket=path, rank=0,
               world_size=8, clock=_clock(1763700600.0), pid=4242, jitter=False, instance=FIXED_INSTANCE)
    c.sample(step=1)
    c._stopping("SIGTERM")
    c.transport.close(bye=None, timeout=2.0)


def _capture(run: Callable[..., object], late_daemon: bool = False, pass_daemon: bool = False,
             lines: Optional[int] = None) -> bytes:
    tmp = tempfile.mkdtemp(prefix="gpm")
    path = os.path.join(tmp, "ingest.sock")
    try:
        # Acknowledging, as the real daemon does: every line is numbered whenever the welcome is
        # read, so the bytes do not depend on thread timing.
        daemon = FakeDaemon(path, ack=True)
        if late_daemon:
            ctx = run(path)
            daemon.start()
            client = ctx["client"]  # type: ignore[index]
            client.sample(step=7)
            client.close(timeout=2.0)
        elif pass_daemon:
            daemon.start()
            run(path, daemon)
        else:
            daemon.start()
            run(path)
        if lines is None:
            daemon.wait_for(1, type="bye")
        else:  # a session that ends without bye
            daemon.wait_for(lines)
        daemon.stop()
        if len(daemon.connections) != 1:
            raise RuntimeError("expected one connection, got %d" % len(daemon.connections))
        return bytes(daemon.connections[0].raw)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# What the client reads from the environment into its output: unset while generating, so the
# fixtures are the same bytes under srun or torchrun (SLURM_JOB_ID, MASTER_ADDR, RANK...) as anywhere.
PINNED_ENV = _env.HELLO_VARS + ("GPUMON_DISABLE", "GPUMON_ATTRIBUTION", "GPUMON_OOM_HISTORY", "GPUMON_SIGNALS")


@contextlib.contextmanager
def _pinned_env() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in PINNED_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def generate() -> Dict[str, bytes]:
    """File name -> exact content."""
    with _pinned_env():
        return _generate()


def _generate() -> Dict[str, bytes]:
    return {
        "client_session.jsonl": _capture(_session),
        "client_minimal.jsonl": _capture(_minimal),
        "client_capped.jsonl": _capture(_capped),
        "client_reconnect.jsonl": _capture(_reconnect, late_daemon=True),
        "client_attribution.jsonl": _capture(_attribution, pass_daemon=True),
        "client_oom_explained.jsonl": _capture(_oom_explained, pass_daemon=True),
        "client_categories.jsonl": _capture(_categories),
        "client_stopped.jsonl": _capture(_stopped, lines=3),
    }


def main(argv: list) -> int:
    check = "--check" in argv
    stale = []
    for name, content in generate().items():
        target = os.path.normpath(os.path.join(FIXTURE_DIR, name))
        try:
            with open(target, "rb") as f:
                same = f.read() == content
        except FileNotFoundError:
            same = False
        if same:
            continue
        stale.append(name)
        if not check:
            with open(target, "wb") as f:
                f.write(content)
            print("wrote", target)
    if check and stale:
        print("fixtures differ from the client's output:", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
