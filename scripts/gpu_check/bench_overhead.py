"""The client's cost per training step: the same loop timed bare and with gpumon_client.attach(),
in one process (attach, time, detach), over rounds whose modes run in a shuffled order; the
cost is judged by the interval of the median per-round difference (analysis.overhead). Two step sizes:
~0.4 ms (a tiny MLP, launch-bound) and ~5 ms (wide layers, GPU-bound), each calibrated on this
GPU by choosing the number of layers. Also times torch.cuda.memory_stats() and
torch.cuda.mem_get_info() bare, the two calls a sample makes.

Modes timed per repeat: bare; attached with the default cadence; attached sampling every step
(max_rate=None, budget=None), which shows a sample's full cost; on CUDA, bare with allocation
history recording as an armed trainer records it (docs/protocol.md, `arm`: max_entries 20000,
Python stacks), which is what arming costs a step while an OOM is coming."""

from __future__ import annotations

import random
import statistics
import time

import trainer_common as tc

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
        per_step(torch, device, step, args.seconds)  # warm-up
        runs = {"bare": [], "default": [], "every": []}
        recording = []  # seconds per step with allocation history on (CUDA only)
        samples = {"default": [], "every": []}
        rng = random.Random(1)
        for r in range(args.repeats):
            # A shuffled order each round: drift and warm caches land on no mode in particular.
            order = ["bare", "default", "every"]
            rng.shuffle(order)
            for mode in order:
                if mode == "bare":
                    runs[mode].append(per_step(torch, device, step, args.seconds))
                    continue
                kw = {} if mode == "default" else {"max_rate": None, "budget": None}
                att = gpumon_client.attach(job="%s-%s-%s" % (args.job, kind, mode), **kw)
                runs[mode].append(per_step(torch, device, step, args.seconds))
                stats = att.client.stats() if att.client is not None else {}
                samples[mode].append(stats.get("sent_lines"))
                gpumon_client.detach()
            if device.type == "cuda":
                recording.append(recorded(torch, device, step, args.seconds))
        result["sizes"][kind] = {
            "layers": layers,
            "target_s": TARGETS[kind],
            "runs": runs,
            "lines_sent": samples,
            "recording": recording,
            "median_step_s": statistics.median(runs["bare"]),
        }
    tc.write_result(args.result, result)


if __name__ == "__main__":
    main()
