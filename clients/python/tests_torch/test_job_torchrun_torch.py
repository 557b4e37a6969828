"""A job over two nodes, for real: `torchrun --nnodes 2` twice on this machine (c10d rendezvous on
127.0.0.1), 2 ranks a node, DDP over gloo on CPU, the real client in every rank (a test stats
source gives each rank its own figures), and two real daemons as the two nodes. Rank 1 runs out
of memory (a torch.cuda.OutOfMemoryError raised through the client's OOM path, as the allocator
calls it); the others die after it, torn down by torchrun or by gloo's broken connections.

Checked: node-a's API names rank 1's oom as the job's first failure and pages for it alone;
`gpumon analyze` over both nodes' record directories names rank 1 on node-a, with its file, and
the 3 ranks that followed; and a real Prometheus scraping both daemons with the shipped rules
fires GpumonJobFailed once, naming rank 1, oom, node-a."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

import support
from test_daemon_e2e_torch import built, get, run_daemon, wait_until
from test_torchrun_torch import free_port, torchrun

support.require("torch")

FAIL_RANK = 1
STEPS = 40
FAIL_AT = 20
TRAIN = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import gpumon_client
from gpumon_client import StaticStatsSource, hooks, testing

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
GIB = 1 << 30
# The rank's own figures: rank r peaks at (20 + r) GiB of an 80 GiB device.
stats = {"allocated_bytes.all.current": (10 + rank) * GIB, "allocated_bytes.all.peak": (20 + rank) * GIB,
         "reserved_bytes.all.current": (24 + rank) * GIB, "num_ooms": 0, "num_alloc_retries": 0}
testing.use_source(StaticStatsSource(stats, (40 * GIB, 80 * GIB), {"cuda_device": 0, "gpu_uuid": "GPU-rank-%d" % rank}))
gpumon_client.attach("llama", max_rate=None, budget=None, write_every=0)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
for step in range(int(sys.argv[1])):
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, 8, generator=gen)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.05)
    if rank == int(sys.argv[2]) and step == int(sys.argv[3]):
        # What the caching allocator does on a failed cudaMalloc: call the OOM observers (the
        # client's sends the oom event), then raise.
        hooks._oom_observer(0, 2 * GIB, 80 * GIB, 100 << 20)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
dist.destroy_process_group()
"""


def snapshot(base):
    status, body = get(base + "/api/v1/snapshot")
    assert status == 200, body
    return json.loads(body)


def job_of(base):
    for j in snapshot(base)["jobs"]:
        if j["job"] == "llama":
            return j
    return None


def start_prometheus(targets, rules, tmp):
    binary = shutil.which("prometheus")
    if binary is None:
        if support.REQUIRE_TOOLS:
            pytest.fail("prometheus is not installed (GPUMON_REQUIRE_TOOLS=1)", pytrace=False)
        return None, None
    port = free_port()
    shutil.copy(rules, os.path.join(tmp, "gpumon.rules.yml"))
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - gpumon.rules.yml\n"
            # Prometheus's default scrape settings: `job` stays the scrape job, the trainer's
            # job name is job_name.
            "scrape_configs:\n  - job_name: gpumon\n    static_configs:\n"
            "      - targets: [%s]\n" % ", ".join("'%s'" % t for t in targets)
        )
    proc = subprocess.Popen(
        [binary, "--config.file=" + cfg, "--storage.tsdb.path=" + os.path.join(tmp, "data"),
         "--web.listen-address=127.0.0.1:%d" % port],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return proc, "http://127.0.0.1:%d" % port


@pytest.mark.torchrun
def test_a_job_over_two_nodes_names_the_rank_that_failed_first(tmp_path, child_env):
    rec_a, rec_b = tmp_path / "rec-a", tmp_path / "rec-b"
    sock_a, sock_b = tempfile.mkdtemp(prefix="gpa"), tempfile.mkdtemp(prefix="gpb")
    daemon_a = run_daemon(sock_a, ["--node-name", "node-a", "--record-dir", str(rec_a)])
    daemon_b = run_daemon(sock_b, ["--node-name", "node-b", "--record-dir", str(rec_b)])
    (base_a, path_a, logs_a), (base_b, path_b, logs_b) = next(daemon_a), next(daemon_b)
    prom = None
    try:
        script = tmp_path / "train.py"
        script.write_text(TRAIN)
        port = free_port()
        rdzv = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", "job-42", "--max-restarts", "0",
                "--monitor-interval", "0.5"]
        argv = torchrun() + rdzv + [str(script), str(STEPS), str(FAIL_RANK), str(FAIL_AT)]
        env = dict(child_env, OMP_NUM_THREADS="1")
        env.pop("GPUMON_TEST_SOURCE", None)  # the script sets each rank's own figures
        nodes = []
        for path in (path_a, path_b):
            out = tmp_path / os.path.basename(os.path.dirname(path))
            out.mkdir()
            nodes.append(subprocess.Popen(argv, env=dict(env, GPUMON_SOCKET=path), cwd=str(out),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in nodes:
            try:
                outs.append(p.communicate(timeout=180)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(p.communicate()[0])
        assert all(p.returncode != 0 for p in nodes), outs  # the job failed
        assert "OutOfMemoryError" in "".join(outs), outs

        # Node a: rank 1's oom is the cause; rank 0 (killed after it) is a consequence.
        def failed():
            j = job_of(base_a)
            return j if j and j["state"] == "failed" and len(j["consequences"]) >= 1 else None

        j = wait_until(failed, 30, "node-a's job failed", logs_a)
        assert j["run_id"] == "job-42", j  # torchrun's TORCHELASTIC_RUN_ID, from --rdzv-id
        assert (j["first_failure"]["rank"], j["first_failure"]["kind"]) == (FAIL_RANK, "oom"), j
        assert j["first_failure"]["host"] == "node-a"
        firing = [f for f in snapshot(base_a)["findings"] if f["state"] == "firing" and f.get("run_id") == "job-42"]
        critical = [(f["kind"], f["rank"]) for f in firing if f["severity"] == "critical"]
        assert critical == [("oom", FAIL_RANK)], firing
        wait_until(lambda: (job_of(base_b) or {}).get("state") == "failed", 30, "node-b's job failed", logs_b)

        # Both nodes' traces, analysed together.
        out = subprocess.run([built("gpumon"), "analyze", "--format", "json", str(rec_a), str(rec_b)],
                             capture_output=True, text=True, timeout=60)
        report = json.loads(out.stdout)
        jobs = [x for x in report["jobs"] if x["run_id"] == "job-42"]
        assert len(jobs) == 1, report["jobs"]
        aj = jobs[0]
        assert aj["ranks"] == [0, 1, 2, 3] and aj["hosts"] == ["node-a", "node-b"], aj
        f = aj["first_failure"]
        assert (f["rank"], f["kind"], f["host"]) == (FAIL_RANK, "oom", "node-a"), aj
        assert f["file"].startswith(str(rec_a)), f
        assert len(aj["consequences"]) == 3, aj

        # A real Prometheus over both daemons, with the shipped rules: one job alert, rank 1.
        rules = os.path.join(support.REPO_ROOT, "dashboards", "prometheus", "gpumon.rules.yml")
        prom_dir = tempfile.mkdtemp(prefix="prom")
        targets = [base_a[len("http://"):], base_b[len("http://"):]]
        prom, prom_url = start_prometheus(targets, rules, prom_dir)
        if prom is None:
            return

        def job_alert():
            try:
                status, body = get(prom_url + "/api/v1/alerts")
            except OSError:  # not listening yet
                return None
            if status != 200:
                return None
            alerts = [a for a in json.loads(body)["data"]["alerts"]
                      if a["labels"].get("alertname") == "GpumonJobFailed" and a["state"] == "firing"]
            return alerts or None

        # The rule's `for: 1m`, and a scrape and evaluation each side of it.
        alerts = wait_until(job_alert, 120, "GpumonJobFailed firing", logs_a)
        assert len(alerts) == 1, alerts
        a = alerts[0]
        assert (a["labels"]["job_name"], a["labels"]["run_id"]) == ("llama", "job-42"), a
        assert "job" not in a["labels"], a  # aggregated away: by (job_name, run_id, uid)
        assert a["annotations"].get("first_rank") == str(FAIL_RANK), a
        assert a["annotations"].get("first_kind") == "oom", a
        assert "node-a" in a["annotations"].get("first_instance", "") or base_a[len("http://"):] in a["annotations"].get("first_instance", ""), a
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(10)
        for gen in (daemon_a, daemon_b):
            gen.close()
        shutil.rmtree(sock_a, ignore_errors=True)
        shutil.rmtree(sock_b, ignore_errors=True)
