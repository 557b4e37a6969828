"""`python -m gpumon_client run` on unmodified real-torch scripts, in child processes whose only
stand-in is the allocator's numbers (a sitecustomize.py calls testing.use_source)."""

import os
import sys

import pytest

import support
from support import check_sample_payload, of_type, run_child, steps

support.require("torch")

# Trains STEPS steps, then ends as HOW says: an exit status, or "raise" for an uncaught exception.
TRAIN = """\
import sys
import torch

print("argv", sys.argv[1:], "name", __name__, "argv0", sys.argv[0], flush=True)
steps, how = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
print("trained", steps, flush=True)
if how == "raise":
    raise RuntimeError("boom from the script")
sys.exit(int(how))
"""

EXACT = ["--max-rate", "0", "--budget", "0"]


@pytest.fixture
def workdir(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "mytrain.py").write_text(TRAIN)
    return work


def launch(workdir, env, *args):
    return run_child([sys.executable, "-m", "gpumon_client", "run", *args], env=env, cwd=str(workdir))


@pytest.mark.parametrize(
    "target,ingest,how,status",
    [
        ("script", "daemon", "3", 3),
        ("script", "no_daemon", "raise", 1),
        ("module", "daemon", "raise", 1),
        ("module", "no_daemon", "0", 0),
    ],
    indirect=["ingest"],
)
def test_run_keeps_argv_and_exit_status_and_reports(workdir, child_env, ingest, target, how, status):
    where = [str(workdir / "train.py")] if target == "script" else ["-m", "mytrain"]
    child = launch(workdir, child_env, "--job", "cli", "--socket", ingest.path, *EXACT, *where, "4", how, "--lr", "3")
    assert child.returncode == status, child
    assert "argv ['4', '%s', '--lr', '3'] name __main__" % how in child.stdout, child
    argv0 = child.stdout.split(" argv0 ", 1)[1].splitlines()[0]
    assert argv0 == str(workdir / ("train.py" if target == "script" else "mytrain.py")), child
    assert "trained 4" in child.stdout, child
    if how == "raise":
        assert child.stderr.count("Traceback") == 1, child
        assert child.stderr.rstrip().endswith("RuntimeError: boom from the script"), child
    else:
        assert "Traceback" not in child.stderr, child
    msgs = ingest.messages()
    if not ingest.up:
        return
    hello = msgs[0]
    assert hello["type"] == "hello" and hello["job"] == "cli" and hello["pid"] != os.getpid()
    assert hello["gpu_uuid"] == support.GPU_UUID
    assert steps(msgs) == [1, 2, 3, 4], msgs
    for sample in of_type(msgs, "sample"):
        check_sample_payload(sample)
    assert len(ingest.daemon.connections) == 1


def test_run_a_missing_script_is_one_line_and_status_2(workdir, child_env):
    child = launch(workdir, child_env, "nope.py")
    assert child.returncode == 2, child
    path = str(workdir / "nope.py")
    assert child.stderr == "python -m gpumon_client run: can't open file %r: [Errno 2] No such file or directory\n" % path
    assert child.stdout == ""


def test_no_cuda_and_no_source_says_so_once_and_runs_the_script(workdir, child_env, sock_dir):
    from gpumon_client.testing import FakeDaemon

    env = dict(child_env, CUDA_VISIBLE_DEVICES="")  # CUDA unavailable even on a machine with a GPU
    del env["GPUMON_TEST_SOURCE"]
    path = os.path.join(sock_dir, "ingest.sock")
    with FakeDaemon(path) as daemon:
        child = launch(workdir, env, "--socket", path, str(workdir / "train.py"), "2", "0")
        assert child.returncode == 0, child
        assert "trained 2" in child.stdout
        lines = child.stderr.splitlines()
        assert len(lines) == 1 and "nothing will be reported" in lines[0], child
        assert not daemon.connections
