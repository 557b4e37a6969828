"""`torchrun --nproc-per-node 2 -m gpumon_client run train.py`: DDP over gloo on CPU, one session
per rank, labelled from torchrun's RANK and WORLD_SIZE."""

import os
import socket
import sys

import pytest
import support
from support import check_sample_payload, of_type, run_child

support.require("torch")

STEPS = 3
DDP_TRAIN = """\
import datetime, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# A rank that cannot reach the other fails in a minute instead of gloo's default half hour.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)  # different data per rank: DDP must average the grads
for _ in range(int(sys.argv[1])):
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, 8, generator=gen)).pow(2).mean().backward()
    opt.step()
weights = [torch.zeros_like(model.module.weight) for _ in range(dist.get_world_size())]
dist.all_gather(weights, model.module.weight.detach())
assert all(torch.equal(w, weights[0]) for w in weights), "ranks diverged"
dist.destroy_process_group()
open("done-%d" % rank, "w").close()  # both ranks share stdout, where lines can interleave
"""


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun():
    # The console script next to this Python, else the module it runs.
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.torchrun
def test_torchrun_two_ranks_two_sessions(tmp_path, child_env, ingest):
    script = tmp_path / "train.py"
    script.write_text(DDP_TRAIN)
    env = dict(child_env, OMP_NUM_THREADS="1")
    launch = ["-m", "gpumon_client", "run", "--job", "ddp", "--socket", ingest.path, "--max-rate", "0", "--budget", "0"]
    # Static rendezvous on a loopback port chosen here: --standalone's c10d rendezvous on
    # "localhost" hung now and then on torch 2.1 on this 2-core machine.
    rdzv = ["--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    argv = torchrun() + rdzv + launch + [str(script), str(STEPS)]
    (tmp_path / "out").mkdir()
    child = run_child(argv, env=env, cwd=str(tmp_path / "out"), timeout=180)
    assert sorted(os.listdir(tmp_path / "out")) == ["done-0", "done-1"], child
    # torch 2.15's gloo aborts a rank at process exit now and then, after the script has
    # finished and after atexit (so after the client's bye): "terminate called without an
    # active exception". The same script under plain torchrun, no client, did so in 2-3 of 6
    # runs on a 2-core machine. That exit is torch's; anything else must be a clean 0.
    torch_teardown = "terminate called without an active exception" in child.stderr
    assert child.returncode == 0 or torch_teardown, child
    if not ingest.up:
        return
    sessions = ingest.sessions(byes=2, timeout=10)
    assert len(sessions) == 2, sessions
    labels = sorted((s[0]["rank"], s[0]["world_size"]) for s in sessions)
    assert labels == [(0, 2), (1, 2)]
    assert len({s[0]["pid"] for s in sessions}) == 2
    for msgs in sessions:
        assert msgs[0]["type"] == "hello" and msgs[0]["job"] == "ddp"
        samples = of_type(msgs, "sample")
        assert [m["step"] for m in samples] == list(range(1, STEPS + 1)), msgs
        for sample in samples:
            check_sample_payload(sample)
        assert msgs[-1]["type"] == "bye"
