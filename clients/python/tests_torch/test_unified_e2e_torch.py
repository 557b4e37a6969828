"""End to end on a unified-memory GPU: a real-torch loop on CPU attached through the client to the
real daemon, NVML played by the fake library's GB10-shaped `gb10` scenario (memory info "Not
Supported", two processes listed). torch's `mem_get_info` on such a device reports the host's
memory, so the client's source gives the host's /proc/meminfo figures; the daemon shows the GPU
as unified and the session's device figures become the unified device's limit."""

import json

from test_daemon_e2e_torch import get, run_daemon, session_of, wait_until

import support
from support import train_step

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client import StaticStatsSource  # noqa: E402

GB10 = "GPU-b10b10b1-0000-4000-8000-000000000000"
GIB = 1 << 30
# The scenario's two processes: 20 and 4 GiB.
PROCESSES_USED = 24 * GIB


def host_meminfo():
    """(MemAvailable, MemTotal) in bytes, as torch.cuda.mem_get_info reports them on GB10."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024
    return fields["MemAvailable"], fields["MemTotal"]


def test_a_trainer_on_a_unified_gpu_is_judged_against_the_unified_limit(sock_dir):
    daemon = run_daemon(sock_dir, scenario="gb10.toml")
    base, socket_path, logs = next(daemon)
    try:
        status, body = get(base + "/api/v1/snapshot")
        assert status == 200, body
        gpu = json.loads(body)["gpus"][0]
        unified, memory = gpu["unified"], gpu["memory"]
        assert unified["processes_used"] == PROCESSES_USED
        _, total = host_meminfo()
        assert 0 < unified["host_available"] <= total
        room = min(x for x in (unified["host_available"], unified["cgroup_headroom"]) if x is not None)
        assert unified["limit_from"] == ("host_available" if room == unified["host_available"] else "cgroup_max")
        assert (memory["used"], memory["free"], memory["total"]) == (PROCESSES_USED, room, PROCESSES_USED + room)

        stats = dict(support.STATS)
        source = StaticStatsSource(stats=stats, mem_info=host_meminfo(), info={"cuda_device": 0, "gpu_uuid": GB10})
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        handle = gpumon_client.attach("spark", source=source, socket=socket_path, max_rate=None, budget=None)
        assert handle.active
        for i in range(5):
            source.mem_info = host_meminfo()
            train_step(torch, model, [opt], seed=i)

        def shown():
            s = session_of(base, "spark")
            return s if s and s.get("samples", 0) >= 1 else None

        s = wait_until(shown, 10, "the session's first sample", logs)
        assert (s["gpu_uuid"], s["gpu"]) == (GB10, 0)
        # The unified device's figures, not torch's host total: used is the processes' sum.
        assert s["device_total"] - s["device_free"] == PROCESSES_USED, s
        gpumon_client.detach()
    finally:
        daemon.close()
