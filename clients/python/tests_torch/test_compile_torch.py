"""attach() with a torch.compile'd model (inductor, C++ codegen on CPU).

In a child process: the first compiled call patches torch process-wide (torch 2.1's dynamo
unwraps every optimizer's step hooks), which must not leak into the other tests.
"""

import os
import sys

import support
from support import check_sample_payload, of_type, run_child, summary

torch = support.require("torch")

# One compile serves both cases: no daemon at the first path, then a daemon at the second.
SCRIPT = """\
import sys, time
import torch
import gpumon_client

absent, present = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
for path in (absent, present):
    handle = gpumon_client.attach("compiled", socket=path, rank=0, world_size=1, max_rate=None, budget=None)
    assert handle.active, handle
    start = time.monotonic()
    for i in range(3):
        opt.zero_grad(set_to_none=True)
        compiled(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    print("%s: 3 steps in %.1fs" % ("no daemon" if path == absent else "daemon", time.monotonic() - start), flush=True)
    gpumon_client.detach()
"""


def test_compiled_model(tmp_path, child_env, sock_dir):
    from gpumon_client.testing import FakeDaemon

    script = tmp_path / "compiled.py"
    script.write_text(SCRIPT)
    path = os.path.join(sock_dir, "ingest.sock")
    with FakeDaemon(path) as daemon:
        argv = [sys.executable, str(script), os.path.join(sock_dir, "absent.sock"), path]
        child = run_child(argv, env=child_env, cwd=str(tmp_path), timeout=300)
        assert child.returncode == 0, child
        # Compiling a 3-layer MLP takes seconds; a minute means something is wrong.
        assert child.seconds < 90, child
        msgs = daemon.wait_for(1, type="bye")
    # torch 2.1's dynamo unwraps the optimizers' step hooks at the first compiled call, so there
    # attach() sees no step at all unless the client restores them.
    assert of_type(msgs, "sample"), "no sample from a compiled model on torch %s:\n%r" % (torch.__version__, child)
    assert [m["type"] for m in msgs] == ["hello", "sample", "sample", "sample", "bye"], summary(msgs)
    assert [m["step"] for m in of_type(msgs, "sample")] == [1, 2, 3]
    for sample in of_type(msgs, "sample"):
        check_sample_payload(sample)
