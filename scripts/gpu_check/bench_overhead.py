"""The client's cost per training step: the same loop timed bare and attached to gpumon, in one
process. Each round, the modes take turns of 8 steps in a new random order at every turn
(clients/python/bench/turns.py: a machine's speed drifts at every time scale, and only modes that take
turns within a few steps see the same machine), each turn ended by a CUDA synchronize inside its
timing; the cost is judged by the interval of the mean per-round difference
(analysis.overhead). Two step sizes:
~0.4 ms (a tiny MLP, launch-bound) and ~5 ms (wide layers, GPU-bound), each calibrated on this
GPU by choosing the number of layers. Also times torch.cuda.memory_stats() and
torch.cuda.mem_get_info() bare, the two calls a sample makes.

Modes timed per repeat: bare; attached with the default cadence (attach()'s own session);
attached sampling every step (max_rate=None, budget=None, a session of its own), which shows a
sample's full cost. Each attached mode's cadence and write schedule read a clock that runs only
during its own turns, so it is sampled as a trainer running only that mode would be. On CUDA, a
block of its own per repeat: bare with allocation history recording as an armed trainer records
it (docs/protocol.md, `arm`: max_entries 20000, Python stacks), which is what arming costs a step
while an OOM is coming."""

from __future__ import annotations

import importlib
import os
import random
import statistics
import sys
import time

import trainer_common as tc

# The turn-taking is the client's bench module, which does not ship with it.
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "clients", "python", "bench")

# Steps a mode runs before the next takes its turn.
STEPS_PER_TURN = 8

TARGETS = {"small": 0.0004, "large": 0.005}


def build(torch, device, kind, layers):
    if kind == "small":
        width, batch = 64, 32
    else:
        width, batch = (2048, 2048) if device.type == "cuda" else (128, 64)
    model = tc.mlp(torch, width, layers, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(batch, width, device=device)

    def step():
        loss = model(x).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def per_step(torch, device, step, seconds, min_steps=20):
    """Seconds per step over about `seconds` of steps (synchronised at both ends)."""
    for _ in range(10):  # untimed: a fresh attach connects and sends its hello here
        step()
    tc.sync(torch, device)
    n, t0 = 0, time.perf_counter()
    while n < min_steps or time.perf_counter() - t0 < seconds:
        step()
        n += 1
    tc.sync(torch, device)
    return (time.perf_counter() - t0) / n


def recorded(torch, device, step, seconds):
    """Seconds per step while allocation history records, as an armed trainer records it."""
    torch.cuda.memory._record_memory_history(max_entries=20000, context="alloc", stacks="python")
    try:
        return per_step(torch, device, step, seconds)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def calibrate(torch, device, kind, target, max_layers):
    """Layers so that a step takes about `target` seconds: t(L) is close to a + b*L."""
    t1 = per_step(torch, device, build(torch, device, kind, 1), 0.2)
    t8 = per_step(torch, device, build(torch, device, kind, 8), 0.2)
    b = max((t8 - t1) / 7.0, 1e-7)
    a = t1 - b
    return int(min(max_layers, max(1, round((target - a) / b))))


def call_cost(fn, n=2000):
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def take_turns_rounds(torch, device, step, turns, args, job):
    """`args.repeats` rounds of the modes taking turns; returns seconds per step per mode per round,
    the recording blocks' seconds per step, each attached mode's samples per round, and the lines
    each attached mode's client sent in all."""
    import gpumon_client
    from gpumon_client import hooks
    sys.path.insert(0, BENCH)
    from turns import on_own_clock, take_turns

    register = importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook
    default = gpumon_client.attach(job=job + "-default")
    if default.client is None:
        raise SystemExit("%s: attach() did nothing: %s" % (tc.prog(), default.reason))
    # The hook runs only in the mode's turns: take_turns registers it for them.
    default._hook_handle.remove()
    default._hook_handle = None
    every = hooks.Attachment(gpumon_client.Client(job + "-every"))
    modes = {"default": default, "every": every}
    clocks = {"default": on_own_clock(default), "every": on_own_clock(every, every=1, max_rate=None, budget=None)}
    arms = {"bare": (None, None), "default": (default.hook, clocks["default"]), "every": (every.hook, clocks["every"])}
    settle = (lambda: tc.sync(torch, device)) if device.type == "cuda" else None
    rng = random.Random(1)
    runs = {"bare": [], "default": [], "every": []}
    samples = {"default": [], "every": []}
    recording = []  # seconds per step with allocation history on (CUDA only)
    try:
        # Untimed: each client connects and says hello at its first sample, which the budget
        # then pays back; the rounds start once the default mode has sampled again.
        deadline = time.monotonic() + 10.0
        while default.cadence._samples < 2 and time.monotonic() < deadline:
            take_turns(step, arms, STEPS_PER_TURN, 2, rng, register, settle=settle)
        for _ in range(args.repeats):
            taken = {mode: att.cadence._samples for mode, att in modes.items()}
            t = take_turns(step, arms, STEPS_PER_TURN, turns, rng, register, settle=settle)
            for mode in runs:
                runs[mode].append(t[mode][0] / (turns * STEPS_PER_TURN))
            for mode, att in modes.items():
                samples[mode].append(att.cadence._samples - taken[mode])
            if device.type == "cuda":
                recording.append(recorded(torch, device, step, args.seconds))
    finally:
        gpumon_client.detach()
        every.client.close()
    sent = {mode: att.client.stats().get("sent_lines") for mode, att in modes.items()}
    return runs, recording, samples, sent


def main() -> None:
    p = tc.parser(__doc__, seconds=1.0)
    p.add_argument("--repeats", type=int, default=30, help="rounds per step size (default 30)")
    p.add_argument("--sizes", default="small,large", help="comma-separated: small (~0.4 ms), large (~5 ms)")
    p.add_argument("--job", default="gpu-check-bench")
    args = p.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    bad = [s for s in sizes if s not in TARGETS]
    if bad or not sizes:
        p.error("--sizes: choose from %s (got %r)" % (",".join(TARGETS), args.sizes))
    if args.repeats < 1:
        p.error("--repeats must be 1 or more")
    device = tc.setup(args)
    import torch
    import gpumon_client
    from gpumon_client.stats import default_source

    result = {"repeats": args.repeats, "seconds": args.seconds, "sizes": {}}
    source = default_source()  # set only in the self-test, where there is no CUDA
    if device.type == "cuda" and source is None:
        result["memory_stats_s"] = call_cost(lambda: torch.cuda.memory_stats(device))
        result["mem_get_info_s"] = call_cost(lambda: torch.cuda.mem_get_info(device))
    elif source is not None:
        result["memory_stats_s"] = call_cost(source.memory_stats)
        result["mem_get_info_s"] = call_cost(source.mem_get_info)

    for kind in sizes:
        layers = calibrate(torch, device, kind, TARGETS[kind], 64)
        step = build(torch, device, kind, layers)
        st = per_step(torch, device, step, args.seconds)  # warm-up, and the step's length
        turns = max(2, int(args.seconds / st / STEPS_PER_TURN))
        runs, recording, samples, sent = take_turns_rounds(torch, device, step, turns, args, "%s-%s" % (args.job, kind))
        result["sizes"][kind] = {
            "layers": layers,
            "target_s": TARGETS[kind],
            "steps_per_turn": STEPS_PER_TURN,
            "turns": turns,
            "runs": runs,
            "samples": samples,
            "lines_sent": sent,
            "recording": recording,
            "median_step_s": statistics.median(runs["bare"]),
        }
    tc.write_result(args.result, result)


if __name__ == "__main__":
    main()
