"""End to end on shared GPUs: a real-torch loop on CPU, attached through the client to the real
daemon on the fake NVML library, in a process NVML lists on two GPUs (8 GiB on GPU 0, 12 GiB on
GPU 1), GPU 1 also running MPS (its server and two clients, one whose memory NVML gives as
"n/a"). Each process is in its own docker container in a /proc the test writes. The process keeps
a row per GPU, its session joins GPU 1's (the GPU its hello names), and each MPS row is charged
to its own pid's container, with no figure where NVML gives none."""

import json
import os

from test_daemon_e2e_torch import get, run_daemon, session_of, wait_until

import support
from support import train_step

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client import StaticStatsSource  # noqa: E402

GPU0 = "GPU-5a5a0000-0000-4000-8000-000000000000"
GPU1 = "GPU-5a5a0001-0000-4000-8000-000000000000"
GIB, MIB = 1 << 30, 1 << 20
SERVER, CLIENT, CLIENT_NA = 7300, 7301, 7302


def container(pid):
    """The container id docker's cgroup v2 scope for `pid` names, as gpumon shows it."""
    return "%012x" % pid


def write_procfs(root, pids):
    with open(os.path.join(root, "stat"), "w") as f:
        f.write("cpu 0 0 0 0 0 0 0 0 0 0\n")
    for pid, name in pids:
        d = os.path.join(root, str(pid))
        os.makedirs(d)
        files = {
            "comm": name + "\n",
            "status": "Name:\t%s\nState:\tS (sleeping)\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\n" % name,
            "cgroup": "0::/system.slice/docker-%s%s.scope\n" % (container(pid), "0" * 52),
        }
        for file, text in files.items():
            with open(os.path.join(d, file), "w") as f:
                f.write(text)


def write_scenario(path, me):
    gpu = '\n[[gpu]]\nname = "NVIDIA H100 80GB HBM3"\nuuid = "%s"\nmemory_total = 85520809984\n'
    proc = '\n[[gpu.process]]\npid = %d\nkind = "%s"\nused = %s\n'
    text = 'driver_version = "580.95.05"\n'
    text += gpu % GPU0 + proc % (me, "compute", 8 * GIB)
    text += gpu % GPU1 + proc % (me, "compute", 12 * GIB)
    text += proc % (SERVER, "compute", 500 * MIB) + proc % (CLIENT, "mps", 6 * GIB) + proc % (CLIENT_NA, "mps", '"n/a"')
    with open(path, "w") as f:
        f.write(text)


def test_a_trainer_on_two_gpus_and_mps_clients_keep_their_rows(sock_dir, tmp_path):
    me = os.getpid()
    procfs = tmp_path / "proc"
    procfs.mkdir()
    write_procfs(str(procfs), [(me, "python"), (SERVER, "nvidia-cuda-mps"), (CLIENT, "python"), (CLIENT_NA, "python")])
    scenario = str(tmp_path / "shared.toml")
    write_scenario(scenario, me)
    daemon = run_daemon(sock_dir, extra_args=("--procfs", str(procfs)), scenario=scenario)
    base, socket_path, logs = next(daemon)
    try:
        source = StaticStatsSource(stats=dict(support.STATS), mem_info=support.MEM_INFO, info={"cuda_device": 1, "gpu_uuid": GPU1})
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        handle = gpumon_client.attach("two-gpus", source=source, socket=socket_path, max_rate=None, budget=None)
        assert handle.active
        for i in range(5):
            train_step(torch, model, [opt], seed=i)

        def joined():
            s = session_of(base, "two-gpus")
            return s if s and (s.get("nvml") or {}).get("used_memory_bytes") is not None else None

        s = wait_until(joined, 10, "the session joined to its GPU's row", logs)
        assert (s["pid"], s["gpu_uuid"], s["gpu"]) == (me, GPU1, 1)
        assert s["nvml"]["used_memory_bytes"] == 12 * GIB
        assert s["nvml"]["container"] == container(me)

        status, body = get(base + "/api/v1/snapshot")
        assert status == 200, body
        procs = json.loads(body)["processes"]

        def rows(pid):
            return sorted(((p["gpu"], p["uuid"], p["kind"], p.get("used_memory_bytes"), p.get("container")) for p in procs if p["pid"] == pid), key=lambda r: r[0])

        assert rows(me) == [(0, GPU0, "compute", 8 * GIB, container(me)), (1, GPU1, "compute", 12 * GIB, container(me))]
        assert rows(SERVER) == [(1, GPU1, "compute", 500 * MIB, container(SERVER))]
        assert rows(CLIENT) == [(1, GPU1, "mps", 6 * GIB, container(CLIENT))]
        assert rows(CLIENT_NA) == [(1, GPU1, "mps", None, container(CLIENT_NA))]
        gpumon_client.detach()
    finally:
        daemon.close()
