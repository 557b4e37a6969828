"""A stop is not a failure, for real: a real torch trainer under the real client and the real
daemon (fake NVML), stopped by SIGINT (Ctrl-C) and by SIGTERM (`timeout`, scancel, preemption),
gives a `stopped` finding (a warning) and a `stopped` job naming the signal. Under torchrun with
gloo, a run stopped by Ctrl-C is `stopped`; a run where one rank raises and torchrun tears the
others down is `failed`, its first failure that rank's crash naming the exception, the others
its consequences. A real Prometheus with the shipped rules then fires GpumonJobFailed once, for
the failed run, and never for the stopped one."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import support
from test_daemon_e2e_torch import built, get, run_daemon, wait_until
from test_job_torchrun_torch import start_prometheus
from test_torchrun_torch import free_port, torchrun

support.require("torch")

GIB = 1 << 30

SINGLE = """\
import sys, time
import torch
import gpumon_client
gpumon_client.attach("alone", max_rate=None, budget=None, write_every=0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while True:
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.02)
    step += 1
    if step == 5:
        open(sys.argv[1], "w").close()
"""

DDP = """\
import datetime, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import gpumon_client
from gpumon_client import StaticStatsSource, testing

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
GIB = 1 << 30
stats = {"allocated_bytes.all.current": (10 + rank) * GIB, "allocated_bytes.all.peak": (20 + rank) * GIB,
         "reserved_bytes.all.current": (24 + rank) * GIB, "num_ooms": 0, "num_alloc_retries": 0}
testing.use_source(StaticStatsSource(stats, (40 * GIB, 80 * GIB), {"cuda_device": 0, "gpu_uuid": "GPU-rank-%d" % rank}))
gpumon_client.attach("ddp", max_rate=None, budget=None, write_every=0)
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
raising = int(sys.argv[1])
step = 0
while True:
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.05)
    step += 1
    if step == 5:
        open("ready-%d" % rank, "w").close()
    if rank == raising and step == 20:
        raise RuntimeError("rank %d found a bad batch" % rank)
"""


def snapshot(base):
    status, body = get(base + "/api/v1/snapshot")
    assert status == 200, body
    return json.loads(body)


def job_of(base, run_id):
    return next((j for j in snapshot(base)["jobs"] if j.get("run_id") == run_id), None)


def findings_of(base, run_id):
    return [f for f in snapshot(base)["findings"] if f.get("run_id") == run_id and f["state"] == "firing"]


def wait_for_files(paths, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        assert proc.poll() is None, "the trainer exited before it was ready: %s" % proc.communicate()[0]
        assert time.monotonic() < deadline, "the trainer was not ready in %d s" % timeout
        time.sleep(0.1)


@pytest.fixture
def node(sock_dir):
    gen = run_daemon(sock_dir)
    yield next(gen)
    gen.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_trainer_stopped_by_a_signal_is_stopped(tmp_path, child_env, node, sig):
    base, socket_path, logs = node
    run_id = "alone-%s" % signal.Signals(sig).name
    script, ready = tmp_path / "train.py", str(tmp_path / "ready")
    script.write_text(SINGLE)
    env = dict(child_env, GPUMON_SOCKET=socket_path, GPUMON_RUN_ID=run_id, OMP_NUM_THREADS="1")
    # SIGINT as a terminal leaves it: a suite started in the background by a shell inherits it
    # ignored, and Python would then raise no KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, str(script), ready], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for_files([ready], proc)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in out, out  # Python's own handler still ran
    else:
        assert proc.returncode == -signal.SIGTERM, out  # the default action still ran
    name = signal.Signals(sig).name

    def ended():
        j = job_of(base, run_id)
        return j if j and j["state"] != "running" else None

    j = wait_until(ended, 30, "the job ended", logs)
    assert j["state"] == "stopped" and j["first_failure"] is None, j
    assert (j["stop"]["kind"], j["stop"]["signal"]) == ("stopped", name), j
    found = findings_of(base, run_id)
    assert [(f["kind"], f["severity"]) for f in found] == [("stopped", "warning")], found
    assert found[0]["evidence"]["signal"] == name
    assert found[0]["message"].startswith("the trainer was stopped by %s" % name), found


def run_ddp(tmp_path, env, run_id, raising, stop=None):
    """A 3-rank torchrun job over gloo; `stop`: the signal sent to its whole process group
    (Ctrl-C in its terminal) once every rank stepped."""
    out = tmp_path / run_id
    out.mkdir()
    script = out / "train.py"
    script.write_text(DDP)
    rdzv = ["--nnodes", "1", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "--max-restarts", "0", "--monitor-interval", "0.5"]
    argv = torchrun() + rdzv + [str(script), str(raising)]
    proc = subprocess.Popen(argv, env=dict(env, GPUMON_RUN_ID=run_id), cwd=str(out), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        if stop is not None:
            wait_for_files([str(out / ("ready-%d" % r)) for r in range(3)], proc)
            os.killpg(proc.pid, stop)
        out_text = proc.communicate(timeout=180)[0]
        return proc.returncode, out_text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.torchrun
def test_torchrun_stopped_and_failed_runs_page_only_for_the_failure(tmp_path, child_env, node):
    base, socket_path, logs = node
    env = dict(child_env, GPUMON_SOCKET=socket_path, OMP_NUM_THREADS="1")
    env.pop("GPUMON_TEST_SOURCE", None)  # the script sets each rank's own figures

    # Ctrl-C: every rank is told SIGINT; the run is stopped.
    code, out = run_ddp(tmp_path, env, "stopped-run", raising=-1, stop=signal.SIGINT)
    assert code != 0, out
    j = wait_until(lambda: (job_of(base, "stopped-run") or {}).get("state") not in (None, "running")
                   and job_of(base, "stopped-run"), 60, "the stopped run ended", logs)
    assert j["state"] == "stopped" and j["first_failure"] is None, j
    assert j["stop"]["signal"] == "SIGINT", j
    assert not [f for f in findings_of(base, "stopped-run") if f["severity"] == "critical"], findings_of(base, "stopped-run")

    # Rank 1 raises; torchrun tears ranks 0 and 2 down.
    code, out = run_ddp(tmp_path, env, "failed-run", raising=1)
    assert code != 0 and "rank 1 found a bad batch" in out, out

    def failed():
        j = job_of(base, "failed-run")
        return j if j and j["state"] == "failed" and len(j["consequences"]) == 2 else None

    j = wait_until(failed, 60, "the failed run's verdict", logs)
    first = j["first_failure"]
    assert (first["rank"], first["kind"]) == (1, "crash"), j
    assert first["exception"] == "RuntimeError: rank 1 found a bad batch", j
    assert sorted(c["rank"] for c in j["consequences"]) == [0, 2], j
    critical = [(f["kind"], f["rank"]) for f in findings_of(base, "failed-run") if f["severity"] == "critical"]
    assert critical == [("crash", 1)], findings_of(base, "failed-run")

    # The failed run's ranks are failed ranks for the job alert (rank 1 first); no stopped rank is.
    status, metrics = get(base + "/metrics")
    failed_series = [l for l in metrics.splitlines() if l.startswith("gpumon_job_rank_failed_timestamp_seconds{")]
    assert failed_series and all('run_id="failed-run"' in l for l in failed_series), failed_series
    first_series = min(failed_series, key=lambda l: float(l.rsplit(" ", 1)[1]))
    assert 'rank="1"' in first_series and 'kind="crash"' in first_series, failed_series

    # A real Prometheus with the shipped rules: one page, for the failed run.
    rules = os.path.join(support.REPO_ROOT, "dashboards", "prometheus", "gpumon.rules.yml")
    prom_dir = tempfile.mkdtemp(prefix="prom")
    prom, prom_url = start_prometheus([base[len("http://"):]], rules, prom_dir)
    if prom is None:
        return
    try:
        def alerts(state):
            try:
                status, body = get(prom_url + "/api/v1/alerts")
            except OSError:
                return None
            if status != 200:
                return None
            found = [a for a in json.loads(body)["data"]["alerts"] if a["labels"].get("alertname") == "GpumonJobFailed"]
            return [a for a in found if state is None or a["state"] == state]

        firing = wait_until(lambda: alerts("firing"), 150, "GpumonJobFailed firing", logs)
        assert len(firing) == 1, firing
        a = firing[0]
        assert a["labels"]["run_id"] == "failed-run", a
        assert (a["annotations"]["first_rank"], a["annotations"]["first_kind"]) == ("1", "crash"), a
        # The stopped run's series were there as long: it never paged, nor went pending.
        assert [x for x in alerts(None) if x["labels"].get("run_id") == "stopped-run"] == []
        status, body = get(prom_url + '/api/v1/query?query=count_over_time(ALERTS{run_id="stopped-run"}[10m])')
        assert status == 200 and json.loads(body)["data"]["result"] == [], body
    finally:
        prom.terminate()
        prom.wait(10)
        shutil.rmtree(prom_dir, ignore_errors=True)
