#!/usr/bin/env python3
"""What measuring the memory split (gpumon_client/categories.py) costs a real training step, on CPU.

One thread, real models and AdamW, the client attached with its real step path (no daemon at the
socket: sending is non-blocking), categories on with the interval forced to 0: every other step
arms (the global module hooks are registered at the end of its optimizer hook) and the step after
is measured (the module hooks run at every module call, the saved-tensor hooks at every tensor
autograd saves, and at its optimizer hook the parameters, gradients, optimizer state and buffers
are read and every hook removed). A measured step is compared with the arming step just before
it (same model, same machine state a few milliseconds apart): the median of those paired
differences is what one measurement costs. The arming step is compared with the same model
attached with categories=False. The quiet steps (all but one in five minutes) run the step path
as before plus, at the 3-4 steps per sample the hook does not only count, one `at_step` call that
finds nothing due: timed on its own.

    $(scripts/torch-venv newest)/bin/python clients/python/bench/bench_categories.py [--pairs 40]
"""

import argparse
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import gpumon_client  # noqa: E402
from gpumon_client import StaticStatsSource  # noqa: E402


def small():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return model, (lambda: torch.randn(32, 64)), "MLP 64-128-10, batch 32"


def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))
    return model, (lambda: torch.randn(32, 512)), "MLP 8x512, batch 32"


def transformer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), torch.nn.Linear(128, 10))
    return model, (lambda: torch.randn(8, 64, 128)), "Transformer encoder 4 layers d=128, batch 8 x 64"


class Trainer:
    def __init__(self, make):
        self.model, self.data, self.label = make()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        x = self.data()
        t0 = time.perf_counter()
        self.model(x).pow(2).mean().backward()
        self.opt.step()
        return time.perf_counter() - t0


def attach(categories):
    # Every step takes the hook's whole path and is sampled (the same cost at every step), so
    # that with the interval at 0 every other step arms.
    source = StaticStatsSource({"allocated_bytes.all.current": 1}, (1, 2), {"cuda_device": 0}, tensor_device="cpu")
    return gpumon_client.attach("bench", source=source, socket="/nonexistent/gpumon.sock", categories=categories,
                                max_rate=None, budget=None)


def run(make, pairs):
    trainer = Trainer(make)
    for _ in range(3):  # warm up: lazy state, the allocator's caches
        trainer.step()
    handle = attach(False)
    off = [trainer.step() for _ in range(2 * pairs)]
    gpumon_client.detach(timeout=0)
    handle = attach(True)
    probe = handle.categories
    probe.interval = 0.0
    arming, diffs, reads, split, last = [], [], [], None, None
    for _ in range(4 * pairs + 4):
        measured = probe.measuring is not None
        dt = trainer.step()
        if measured and last is not None:
            diffs.append(dt - last)
            reads.append(probe.cost)
            split = probe.last
        elif not measured and probe.measuring is not None:
            arming.append(dt)
            last = dt
            continue
        last = None
    gpumon_client.detach(timeout=0)
    modules = sum(1 for _ in trainer.model.modules())
    return trainer.label, modules, off, arming, diffs, reads, split


def quiet_path(n=200000):
    """One `at_step` that finds nothing due, as the quiet steps' decisions make it."""
    from gpumon_client.categories import CategoryProbe

    probe = CategoryProbe(lambda: None)
    probe.at_step(3, None)  # armed_at set: the next is 300 s away
    probe.measuring = None
    opt = object()
    t0 = time.perf_counter()
    for step in range(4, 4 + n):
        probe.at_step(step, opt)
        probe.skip_limit(step)
    return (time.perf_counter() - t0) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("torch %s, %s, one thread" % (torch.__version__, sys.platform))
    print("quiet step: at_step + skip_limit with nothing due: %.2f us per decision" % (quiet_path() * 1e6))
    for make in (small, mlp, transformer):
        label, modules, off, arming, diffs, reads, split = run(make, args.pairs)
        q = statistics.quantiles(diffs, n=4)
        print("\n%s (%d modules)" % (label, modules))
        print("  step, categories off:    %8.3f ms (median)" % (statistics.median(off) * 1e3))
        print("  arming step:             %8.3f ms (median)" % (statistics.median(arming) * 1e3))
        print("  measured step, extra:    %+8.3f ms (median of %d pairs; quartiles %+.3f, %+.3f), %+.0f %% of a step"
              % (statistics.median(diffs) * 1e3, len(diffs), q[0] * 1e3, q[2] * 1e3,
                 100 * statistics.median(diffs) / statistics.median(off)))
        print("    of which reading at its optimizer hook: %.3f ms" % (statistics.median(reads) * 1e3))
        print("  split: %s" % (split,))


if __name__ == "__main__":
    main()
