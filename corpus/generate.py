#!/usr/bin/env python3
"""Writes the leak-detection corpus: realistic trainer traces (docs/protocol.md) and labels.json.

    python3 corpus/generate.py OUT_DIR [--shape NAME ...] [--cadence fixed|adaptive|both]

Deterministic: every trace's random stream is seeded from its file name, so the same command
writes the same bytes, and a subset (--shape) holds the same traces as the full corpus.
See corpus/README.md for the shapes and what each label means.
"""

import argparse
import hashlib
import json
import os
import re
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import floor_model as fm  # noqa: E402
from cadence import CADENCES, thin  # noqa: E402
from sim import MIB, Config, Rng, Sim, q512, up2m  # noqa: E402

KIB = fm.KIB
GB = 1e9
DEVICES = {
    "a100": {"name": "NVIDIA A100-SXM4-40GB", "total": 42505273344},
    "h100": {"name": "NVIDIA H100 80GB HBM3", "total": 85520809984},
}
# Four traces per shape: two seeds on each device.
INSTANCES = [("a100", 1), ("h100", 2), ("a100", 3), ("h100", 4)]
MAX_SAMPLES = 3000  # per trace, train samples; longer runs sample every N steps like attach(every=N)
JOBS = [
    "llama3-8b-sft",
    "mistral-7b-dpo",
    "vit-h14-pretrain",
    "bert-large-mlm",
    "t5-xl-summarize",
    "gpt-neox-1.3b",
    "sd21-unet-ft",
    "whisper-medium-ft",
    "clip-vitl-ft",
    "qwen2-1.5b-pt",
    "deberta-v3-cls",
    "resnet152-imagenet",
]


def seed_of(name: str) -> int:
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:16], 16)


def pick_every(steps: int, budget_steps: Optional[float] = None, choices: Tuple[int, ...] = (1, 2, 4, 5, 10, 20, 25, 50)) -> int:
    """Sampling period: at most MAX_SAMPLES train samples, but >= 150 inside a leak's growth budget."""
    i = 0
    while i + 1 < len(choices) and steps / choices[i] > MAX_SAMPLES:
        i += 1
    if budget_steps is not None:
        while i > 0 and budget_steps / choices[i] < 150:
            i -= 1
    return choices[i]


def hello(rng: Rng, expandable: bool) -> Dict[str, Any]:
    world = rng.pick([1, 2, 4, 8, 8, 8])
    rank = rng.int(0, world - 1)
    uuid = "GPU-%08x-%04x-%04x-%04x-%012x" % (
        rng.int(0, 2**32 - 1),
        rng.int(0, 2**16 - 1),
        rng.int(0, 2**16 - 1),
        rng.int(0, 2**16 - 1),
        rng.int(0, 2**48 - 1),
    )
    return {
        "type": "hello",
        "v": 1,
        "pid": rng.int(2000, 400000),
        "job": rng.pick(JOBS),
        "rank": rank,
        "world_size": world,
        "cuda_device": rank % 8,
        "gpu_uuid": uuid,
        "client": "gpumon-py/0.1.0",
        "torch": rng.pick(["2.3.1", "2.4.1", "2.5.1", "2.6.0"]),
        "allocator": "native",
        "expandable_segments": expandable,
    }


def warmup(rng: Rng, base_final: int, ddp: bool, compiled: bool, late_bytes: int = 0, late_until: int = 0) -> List[List[Any]]:
    """Floor increments before training is steady: [step, bytes, extra seconds for that step].

    Step 1 carries weights, gradients and the optimizer state Adam creates on its first step;
    DDP rebuilds its gradient buckets after the first iteration; a second stream gets its own
    cuBLAS workspace; torch.compile recompiles (and CUDA-graph pools grow) as new shapes show up.
    """
    inc: List[List[Any]] = []
    if ddp:
        inc.append([2, q512(base_final * rng.u(0.01, 0.04)), 0.0])
    inc.append([rng.int(2, 3), rng.pick([8, 32]) * MIB, 0.0])
    if compiled:
        s = 2
        for _ in range(rng.int(1, 4)):
            s += rng.int(1, 3) * s
            inc.append([s, q512(rng.u(16, 256) * MIB), rng.u(4.0, 30.0)])
    if late_bytes:
        n = rng.int(4, 8)
        s = 50
        for i in range(n):
            frac = (i + 1) / n
            s = max(s + 10, int(50 + (late_until - 50) * frac * frac))
            inc.append([s, q512(late_bytes / n * rng.u(0.6, 1.0)), rng.u(4.0, 30.0)])
    first = base_final - sum(x[1] for x in inc)
    inc.insert(0, [1, first, rng.u(25.0, 120.0) if compiled else rng.u(2.0, 8.0)])
    return inc


def common(rng: Rng, device: str, shape: str, kind: str) -> Config:
    """Draws what every trace has: device, allocator behaviour, model size, timing, warm-up."""
    total = DEVICES[device]["total"]
    expandable = rng.chance(0.3)
    h = hello(rng, expandable)
    ddp = h["world_size"] > 1
    frag = rng.u(0.005, 0.02) if expandable else rng.u(0.03, 0.08)
    cfg = Config(
        shape=shape,
        total=total,
        other=up2m(rng.u(400, 560) * MIB) + (up2m(rng.u(200, 900) * MIB) if ddp else 0),
        step_time=rng.u(0.2, 2.0),
        jitter=rng.u(0.03, 0.1),
        frag=frag,
        frag_final=frag,
        frag_ramp=rng.u(20, 200),
        split_share=rng.u(0.01, 0.05) if expandable else rng.u(0.05, 0.45),
        rho=rng.u(0.0004, 0.003),
        expandable=expandable,
        hello=h,
        ts0=1762000000.0 + rng.int(0, 4000000),
        floor_jitter_blocks=rng.pick([0, 0, 0, 16, 256, 4096]),
    )
    cfg.base = q512(rng.u(0.17, 0.28) * total)
    cfg.act0 = q512(rng.u(0.1, 0.2) * total)
    cfg.ddp = ddp
    cfg.compiled = rng.chance(0.5)
    cfg.warmup = warmup(rng, cfg.base, ddp, cfg.compiled)
    cfg.kind = kind
    return cfg


def warmup_end(cfg: Config) -> int:
    return max(int(w[0]) for w in cfg.warmup)


def small_eval(rng: Rng, cfg: Config, p: float, every: int) -> None:
    """Evaluation that needs less memory than training (no gradients), every so often."""
    if not rng.chance(p):
        return
    period = max(every, rng.int(500, 3000) // every * every)
    cfg.eval = {
        "period": period,
        "batches": rng.int(5, 25),
        "transient": q512(rng.u(0, 8) * MIB),
        "act_scale": rng.u(0.5, 0.85),
        "time_scale": rng.u(0.3, 0.6),
        "empty_cache": rng.chance(0.4),
    }


def plain_checkpoints(rng: Rng, cfg: Config, p: float) -> None:
    """Checkpoint saves that copy tensors straight to the host: a pause, no extra device memory."""
    if rng.chance(p):
        cfg.ckpt = {"period": rng.int(1000, 5000), "pause": [8.0, 90.0], "gather": 0}


def varlen(rng: Rng, cfg: Config, ret_gb: Tuple[float, float], act_frac: Tuple[float, float], min_x: Tuple[float, float], skew: Tuple[float, float]) -> None:
    """Variable sequence lengths: retained outputs (noisy floor) and activations scale with length."""
    scale = cfg.total / DEVICES["a100"]["total"]
    cfg.varlen = {
        "ret_max": q512(rng.u(*ret_gb) * GB * scale),
        "act_max": q512(rng.u(*act_frac) * cfg.total),
        "quad": rng.u(0.0, 0.4),
        "skew": rng.u(*skew),
        "min_x": rng.u(*min_x),
    }


def growth_room(cfg: Config) -> int:
    """How far a leak may grow and still leave the run clear of allocator retries."""
    frag = max(cfg.frag, cfg.frag_final)
    return int(0.96 * cfg.usable() / (1.0 + frag)) - cfg.base - cfg.peak_extra_max()


def linear_leak(rng: Rng, cfg: Config, onset: int, rate: int, growth: float, min_steps: int = 2000, max_steps: int = 50000) -> None:
    room = growth_room(cfg)
    growth = min(growth, room)
    steps = onset + -(-int(growth) // rate)
    if steps < min_steps:
        steps = min_steps
        rate = min(rate, q512(room / (steps - onset)))
    if steps > max_steps:
        steps = max_steps
        rate = -(-int(growth / (steps - onset)) // fm.BLOCK) * fm.BLOCK
    cfg.steps = steps
    cfg.leak = {"base_bytes": cfg.base, "onset_step": onset, "leak": {"type": "linear", "bytes_per_step": rate}}


# --- healthy shapes ---------------------------------------------------------------------------
def warmup_then_flat(rng: Rng, cfg: Config) -> None:
    cfg.compiled = True
    budget = fm.growth_budget(cfg.total)
    cfg.warmup = warmup(rng, cfg.base, cfg.ddp, True, late_bytes=int(budget * rng.u(0.15, 0.3)), late_until=rng.int(300, 1500))
    cfg.steps = rng.int(4000, 12000)
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.4, cfg.every)


def level_shift(rng: Rng, cfg: Config) -> None:
    cfg.act0 = q512(rng.u(0.08, 0.14) * cfg.total)
    cfg.step_time = rng.u(0.2, 1.2)  # longer sequences after the switch make steps 1.4-1.9x slower
    cfg.steps = rng.int(4000, 20000)
    at = int(cfg.steps * rng.u(0.3, 0.65))
    # Longer sequences keep bigger buffers alive between steps (RoPE caches, the last batch's
    # outputs): 10-55% of the leak budget at once, then flat.
    shift = q512(rng.u(0.1, 0.55) * fm.growth_budget(cfg.total))
    cfg.shifts = [[at, shift, rng.u(1.4, 2.0), rng.u(1.4, 1.9)]]
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.4, cfg.every)


def eval_heavy(rng: Rng, cfg: Config) -> None:
    cfg.steps = rng.int(3000, 15000)
    cfg.every = pick_every(cfg.steps)
    scale = cfg.total / DEVICES["a100"]["total"]
    batches = rng.int(15, 40)
    cfg.eval = {
        "period": max(cfg.every, rng.int(300, 1500) // cfg.every * cfg.every),
        "batches": batches,
        "transient": q512(rng.u(0.5, 3.0) * GB * scale / batches),
        "act_scale": rng.u(1.15, 1.4),
        "time_scale": rng.u(0.3, 0.6),
        "empty_cache": rng.chance(0.5),
    }


def checkpoints(rng: Rng, cfg: Config) -> None:
    cfg.steps = rng.int(3000, 15000)
    cfg.every = pick_every(cfg.steps)
    cfg.ckpt = {
        "period": rng.int(300, 1500),
        "pause": [10.0, 120.0],
        "gather": q512(rng.u(0.1, 0.5) * cfg.base),  # consolidating a full state dict on the device
        "empty_cache": rng.chance(0.5),
    }
    small_eval(rng, cfg, 0.4, cfg.every)


def rare_spikes(rng: Rng, cfg: Config) -> None:
    cfg.steps = rng.int(4000, 20000)
    cfg.every = pick_every(cfg.steps)
    scale = cfg.total / DEVICES["a100"]["total"]
    cfg.spikes = {
        "floor_p": 1.0 / rng.u(800, 3000),
        "floor_range": [0.2 * GB * scale, 2.5 * GB * scale],
        "peak_p": 1.0 / rng.u(300, 1500),
        "peak_range": [0.2, 0.6],
    }
    plain_checkpoints(rng, cfg, 0.5)


def accumulation(rng: Rng, cfg: Config) -> None:
    cfg.accum = {"k": rng.pick([2, 4, 8, 16]), "grads": q512(cfg.base * rng.u(0.2, 0.3)), "per_micro": q512(rng.u(16, 192) * MIB)}
    cfg.step_time = rng.u(0.2, 0.6)  # one micro-batch
    cfg.floor_jitter_blocks = 0


def grad_accum(rng: Rng, cfg: Config) -> None:
    accumulation(rng, cfg)
    cfg.steps = rng.int(2000, 8000)
    cfg.every = pick_every(cfg.steps, choices=(1, 3, 5, 7))
    plain_checkpoints(rng, cfg, 0.4)


def seq_varlen(rng: Rng, cfg: Config) -> None:
    varlen(rng, cfg, (0.3, 2.5), (0.1, 0.22), (0.1, 0.35), (1.5, 3.0))
    cfg.frag = rng.u(0.02, 0.04)
    cfg.frag_final = rng.u(0.08, 0.15)
    cfg.steps = rng.int(4000, 20000)
    cfg.frag_steps = int(cfg.steps * rng.u(0.1, 0.4))
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.4, cfg.every)


def near_limit_config(rng: Rng, cfg: Config) -> None:
    cfg.expandable = cfg.hello["expandable_segments"] = False
    varlen(rng, cfg, (0.2, 1.0), (0.15, 0.25), (0.3, 0.6), (1.0, 2.0))
    cfg.frag = cfg.frag_final = rng.u(0.04, 0.08)
    cfg.frag_ramp = rng.u(20, 100)
    cfg.split_share = rng.u(0.3, 0.6)
    cfg.base = q512(cfg.usable() * rng.u(0.95, 0.975)) - cfg.peak_extra_max()
    cfg.warmup = warmup(rng, cfg.base, cfg.ddp, cfg.compiled)
    cfg.steps = rng.int(3000, 15000)
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.3, cfg.every)


def near_limit(rng: Rng, cfg: Config) -> None:
    near_limit_config(rng, cfg)


def oom_recovered(rng: Rng, cfg: Config) -> None:
    near_limit_config(rng, cfg)
    cfg.oom_policy = "skip"
    cfg.max_ooms = 10**9
    for _ in range(rng.int(1, 2)):
        cfg.giant_steps[rng.int(cfg.steps // 5, cfg.steps - 50)] = rng.u(1.35, 1.6)


def preempted(rng: Rng, cfg: Config) -> None:
    cfg.steps = rng.int(3000, 15000)
    cfg.every = pick_every(cfg.steps)
    cfg.end_crash_step = int(cfg.steps * rng.u(0.4, 0.95))
    small_eval(rng, cfg, 0.5, cfg.every)
    plain_checkpoints(rng, cfg, 0.5)


def immaterial_drift(rng: Rng, cfg: Config) -> None:
    cfg.steps = rng.int(20000, 50000)
    cfg.every = pick_every(cfg.steps)
    cfg.drift = {
        "base_bytes": 0,
        "onset_step": warmup_end(cfg),
        "leak": {"type": "linear", "bytes_per_step": fm.BLOCK * rng.int(2, 6)},
    }
    small_eval(rng, cfg, 0.4, cfg.every)


def outside_steps(rng: Rng, cfg: Config) -> None:
    """Memory outside the allocator that steps up and holds: NCCL's buffers over the first
    steps, then a one-time workspace for a new shape; a flat allocator."""
    warm = rng.int(100, 300)
    nccl = up2m(rng.u(200, 1000) * MIB)
    cfg.other_steps = [[1 + warm * i // 8, nccl // 8] for i in range(8)]
    cfg.steps = rng.int(6000, 15000)
    cfg.other_steps.append([rng.int(cfg.steps // 3, 2 * cfg.steps // 3), up2m(rng.u(256, 1536) * MIB)])
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.3, cfg.every)


# --- memory outside the allocator that keeps growing --------------------------------------------
def outside_growth(rng: Rng, cfg: Config) -> None:
    """A flat allocator while the process's memory outside it grows linearly (a communicator or
    a raw cudaMalloc buffer made per step): 2.3-3.5x the materiality budget, at 0.5-4 MiB/step."""
    budget = fm.growth_budget(cfg.total)
    u = rng.u()
    rate = q512(512 * KIB * (1.0 + 7.0 * u * u))
    onset = warmup_end(cfg) + rng.int(0, 300)
    growth = min(rng.u(2.3, 3.5) * budget, 0.5 * growth_room(cfg))
    cfg.steps = max(onset + 2000, onset + int(growth) // rate)
    cfg.other_growth = {"onset_step": onset, "bytes_per_step": rate}
    cfg.every = pick_every(cfg.steps, budget / rate)
    small_eval(rng, cfg, 0.3, cfg.every)


# --- the cache: normal growth that stops, and a creep that does not -----------------------------
def cache_warmup_plateau(rng: Rng, cfg: Config) -> None:
    """The cache grows in segments over the first 150-600 steps, less and less often, then holds:
    new shapes, compile and the first evaluations finding room in it."""
    n = rng.int(8, 16)
    until = rng.int(150, 600)
    total = rng.u(0.02, 0.06) * cfg.total
    cfg.cache_steps = [[2 + int(until * (i / n) ** 2), up2m(total / n * rng.u(0.5, 1.5))] for i in range(n)]
    cfg.steps = rng.int(4000, 12000)
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.4, cfg.every)


def cache_longest_batch(rng: Rng, cfg: Config) -> None:
    """Variable sequence lengths: the cache steps up each time a batch is the longest yet, ever
    more rarely, and stops at the longest."""
    cfg.steps = rng.int(4000, 16000)
    top = rng.u(0.05, 0.12) * cfg.total
    longest = 0.0
    for s in range(1, cfg.steps + 1):
        x = rng.u() ** 2
        if x > longest:
            cfg.cache_steps.append([s, up2m(top * (x - longest))])
            longest = x
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.4, cfg.every)


def cache_eval_once(rng: Rng, cfg: Config) -> None:
    """Evaluation's shapes grow the cache once, at the first evaluation, and it holds."""
    cfg.steps = rng.int(3000, 12000)
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 1.0, cfg.every)
    cfg.cache_steps = [[cfg.eval["period"] + 1, up2m(rng.u(0.02, 0.06) * cfg.total)]]


def cache_graphs(rng: Rng, cfg: Config) -> None:
    """CUDA graph capture: a pool for each of 2-4 graphs captured early, one recapture for a new
    shape later on."""
    cfg.compiled = True
    cfg.steps = rng.int(3000, 12000)
    s = 1
    for _ in range(rng.int(2, 4)):
        s += rng.int(2, 80)
        cfg.cache_steps.append([s, up2m(rng.u(0.5, 2.5) * GB)])
    cfg.cache_steps.append([rng.int(cfg.steps // 3, 2 * cfg.steps // 3), up2m(rng.u(0.5, 2.5) * GB)])
    cfg.every = pick_every(cfg.steps)
    small_eval(rng, cfg, 0.3, cfg.every)


def cache_creep(rng: Rng, cfg: Config) -> None:
    """Reserved creeps 8-138 MiB a step while allocated stays flat (torch issue #123548: ~138 MiB
    a cycle with max_split_size_mb and expandable_segments); the run ends before the device is
    full, at 60-85% of the room left."""
    rate = up2m(rng.pick([8, 32, 138]) * MIB)
    onset = rng.int(1, 200)
    room = growth_room(cfg)
    cfg.steps = onset + max(300, int(room * rng.u(0.6, 0.85)) // rate)
    cfg.cache_growth = {"onset_step": onset, "bytes_per_step": rate}
    cfg.every = pick_every(cfg.steps, room / rate)
    small_eval(rng, cfg, 0.3, cfg.every)


# --- leaks ----------------------------------------------------------------------------------
def leak_linear(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    u = rng.u()
    rate = q512(512 * KIB * (1.0 + 7.0 * u * u))
    linear_leak(rng, cfg, warmup_end(cfg) + rng.int(0, 300), rate, rng.u(2.3, 3.5) * budget)
    cfg.every = pick_every(cfg.steps, budget / cfg.leak["leak"]["bytes_per_step"])
    small_eval(rng, cfg, 0.4, cfg.every)
    plain_checkpoints(rng, cfg, 0.5)


def leak_tiny_long(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    lo, hi = (100, 160) if cfg.total < 50 * GB else (112, 200)
    rate = fm.BLOCK * rng.int(lo * 2, hi * 2)
    onset = warmup_end(cfg) + rng.int(0, 300)
    steps = max(30000, min(50000, onset + -(-int(2.2 * budget) // rate)))
    rate = max(rate, -(-int(2.0 * budget / (steps - onset)) // fm.BLOCK) * fm.BLOCK)
    cfg.steps = steps
    cfg.leak = {"base_bytes": cfg.base, "onset_step": onset, "leak": {"type": "linear", "bytes_per_step": rate}}
    cfg.every = pick_every(cfg.steps, budget / rate)
    small_eval(rng, cfg, 0.5, cfg.every)
    plain_checkpoints(rng, cfg, 0.5)


def leak_staircase(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    jump = q512(rng.u(64, 320) * MIB)
    jumps = -(-int(2.3 * budget) // jump) + rng.int(0, 4)
    jumps = min(jumps, growth_room(cfg) // jump)
    onset = warmup_end(cfg) + rng.int(50, 400)
    period = rng.int(300, max(300, min(2500, (48000 - onset) // jumps)))
    cfg.steps = onset + jumps * period + rng.int(0, period // 2)
    cfg.leak = {
        "base_bytes": cfg.base,
        "onset_step": onset,
        "leak": {"type": "periodic", "first_jump_step": onset + 1, "period": period, "jump_bytes": jump},
    }
    cfg.every = pick_every(cfg.steps, budget / jump * period)
    small_eval(rng, cfg, 0.4, cfg.every)
    plain_checkpoints(rng, cfg, 0.5)


def leak_eval_only(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    jump = q512(rng.u(96, 256) * MIB)
    evals = -(-int(2.3 * budget) // jump) + rng.int(0, 3)
    evals = min(evals, growth_room(cfg) // jump)
    period = rng.int(200, 800)
    if period * evals > 48000:
        period = 48000 // evals
    steps = period * evals + rng.int(0, period - 1)
    every = pick_every(steps, budget / jump * period)
    period = max(every, period // every * every)
    cfg.steps = period * evals + rng.int(0, period - 1)
    cfg.every = every
    cfg.eval = {
        "period": period,
        "batches": rng.int(8, 30),
        "transient": q512(rng.u(0, 4) * MIB),
        "act_scale": rng.u(0.55, 0.85),
        "time_scale": rng.u(0.3, 0.6),
        "empty_cache": rng.chance(0.4),
        "leak_jump": jump,  # e.g. eval predictions appended to a list that outlives the eval loop
    }
    cfg.leak = {
        "base_bytes": cfg.base,
        "onset_step": period,
        "leak": {"type": "periodic", "first_jump_step": period + 1, "period": period, "jump_bytes": jump},
    }
    plain_checkpoints(rng, cfg, 0.4)


def leak_late_onset(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    steps = rng.int(10000, 40000)
    onset = int(steps * rng.u(0.55, 0.82))
    growth = min(rng.u(2.3, 3.5) * budget, growth_room(cfg))
    rate = max(100 * KIB, q512(growth / (steps - onset)))
    cfg.steps = steps
    cfg.leak = {"base_bytes": cfg.base, "onset_step": onset, "leak": {"type": "linear", "bytes_per_step": rate}}
    cfg.every = pick_every(steps, budget / rate)
    small_eval(rng, cfg, 0.4, cfg.every)
    plain_checkpoints(rng, cfg, 0.5)


def leak_noisy(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    varlen(rng, cfg, (0.3, 1.5), (0.1, 0.2), (0.15, 0.4), (1.0, 2.5))
    cfg.floor_jitter_blocks = 0
    rate = q512(MIB * rng.u(1.0, 4.0))
    linear_leak(rng, cfg, warmup_end(cfg) + rng.int(0, 300), rate, rng.u(2.3, 3.5) * budget)
    cfg.every = pick_every(cfg.steps, budget / cfg.leak["leak"]["bytes_per_step"])
    small_eval(rng, cfg, 0.4, cfg.every)


def leak_accum_sawtooth(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    accumulation(rng, cfg)
    cfg.accum["k"] = rng.pick([4, 8])
    rate = q512(MIB * rng.u(0.75, 3.0))
    linear_leak(rng, cfg, warmup_end(cfg) + rng.int(0, 100), rate, rng.u(2.3, 3.2) * budget)
    cfg.every = pick_every(cfg.steps, budget / cfg.leak["leak"]["bytes_per_step"], choices=(1, 3, 5, 7))
    plain_checkpoints(rng, cfg, 0.4)


def leak_accelerating(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    r0 = q512(rng.u(128, 768) * KIB)
    r1 = q512(r0 * rng.u(3.0, 6.0))
    growth = min(rng.u(2.3, 3.2) * budget, growth_room(cfg))
    ramp = -(-int(2 * growth) // (r0 + r1))
    if ramp > 45000:  # too slow for the longest run: scale the rates up
        factor = ramp / 45000.0
        r0, r1 = q512(r0 * factor) + fm.BLOCK, q512(r1 * factor) + fm.BLOCK
        ramp = -(-int(2 * growth) // (r0 + r1))
    onset = warmup_end(cfg) + rng.int(0, 300)
    cfg.steps = max(2000, onset + ramp)
    cfg.leak = {
        "base_bytes": cfg.base,
        "onset_step": onset,
        "leak": {"type": "accelerating", "bytes_per_step": r0, "bytes_per_step_at_ramp_end": r1, "ramp_steps": ramp},
    }
    budget_steps = fm.first_crossing(cfg.leak, 0, cfg.base + budget) - onset
    cfg.every = pick_every(cfg.steps, budget_steps)
    small_eval(rng, cfg, 0.4, cfg.every)
    plain_checkpoints(rng, cfg, 0.5)


def leak_oom_crash(rng: Rng, cfg: Config) -> None:
    budget = fm.growth_budget(cfg.total)
    cfg.expandable = cfg.hello["expandable_segments"] = False
    cfg.frag = cfg.frag_final = rng.u(0.04, 0.08)
    varlen(rng, cfg, (0.1, 0.6), (0.12, 0.22), (0.45, 0.7), (1.0, 1.5))
    cfg.floor_jitter_blocks = 0
    headroom = rng.u(3.0, 5.5) * budget  # floor growth from onset until the peak meets the limit
    cfg.base = q512(cfg.usable() - cfg.peak_extra_max() - headroom)
    cfg.warmup = warmup(rng, cfg.base, cfg.ddp, cfg.compiled)
    onset = warmup_end(cfg) + rng.int(0, 200)
    rate = q512(MIB * rng.u(1.5, 6.0))
    cfg.steps = onset + int(2 * headroom / rate) + 1000  # never reached: the run dies first
    cfg.leak = {"base_bytes": cfg.base, "onset_step": onset, "leak": {"type": "linear", "bytes_per_step": rate}}
    cfg.oom_policy = "crash"
    cfg.max_ooms = rng.int(3, 8)
    cfg.every = pick_every(onset + int(headroom / rate), budget / rate)
    small_eval(rng, cfg, 0.3, cfg.every)


SHAPES: Dict[str, Tuple[str, Callable[[Rng, Config], None], str]] = {
    "warmup_then_flat": ("healthy", warmup_then_flat, "optimizer state at step 1, cuBLAS, DDP buckets, torch.compile recompiles up to step ~1500, then flat"),
    "level_shift": ("healthy", level_shift, "one curriculum switch to longer sequences: floor and peak step up once, then flat"),
    "eval_heavy": ("healthy", eval_heavy, "eval phases whose floor and peak exceed training's"),
    "checkpoints": ("healthy", checkpoints, "checkpoint saves: pauses, a gather spike in the next peak, reserved steps up"),
    "rare_spikes": ("healthy", rare_spikes, "rare single-sample floor outliers and peak spikes"),
    "grad_accum": ("healthy", grad_accum, "samples per micro-batch: floor cycles with the accumulation period"),
    "varlen": ("healthy", seq_varlen, "variable sequence length: noisy floor, reserved grows then plateaus"),
    "near_limit": ("healthy", near_limit, "peak within a few % of the device: allocator retries, flat floor"),
    "oom_recovered": ("healthy", oom_recovered, "near the limit; one or two oversized batches OOM, are skipped, training goes on"),
    "preempted": ("healthy", preempted, "flat run killed without bye"),
    "immaterial_drift": ("healthy", immaterial_drift, "1-3 KiB/step of real growth: below any materiality floor"),
    "outside_steps": ("healthy", outside_steps, "memory outside the allocator steps up (NCCL warm-up, one workspace) and holds"),
    "outside_growth": ("untracked", outside_growth, "flat allocator; memory outside it grows 0.5-4 MiB/step"),
    "cache_warmup_plateau": ("healthy", cache_warmup_plateau, "the cache grows in segments over the first 150-600 steps, then holds"),
    "cache_longest_batch": ("healthy", cache_longest_batch, "variable lengths: the cache steps up to the longest batch yet, ever more rarely"),
    "cache_eval_once": ("healthy", cache_eval_once, "the first evaluation grows the cache once, then it holds"),
    "cache_graphs": ("healthy", cache_graphs, "CUDA graph pools captured early, one recapture later"),
    "cache_creep": ("cache", cache_creep, "reserved creeps 8-138 MiB/step while allocated is flat"),
    "leak_linear": ("leak", leak_linear, "slow linear leak, 0.5-4 MiB/step"),
    "leak_tiny_long": ("leak", leak_tiny_long, "100-200 KiB/step over 30k-50k steps"),
    "leak_staircase": ("leak", leak_staircase, "64-320 MiB jumps at a fixed period"),
    "leak_eval_only": ("leak", leak_eval_only, "floor steps up after each eval phase only"),
    "leak_late_onset": ("leak", leak_late_onset, "flat for 55-82% of the run, then linear"),
    "leak_noisy": ("leak", leak_noisy, "linear leak under a variable-length noisy floor"),
    "leak_accum_sawtooth": ("leak", leak_accum_sawtooth, "linear leak under a gradient-accumulation sawtooth"),
    "leak_accelerating": ("leak", leak_accelerating, "per-step leak grows 3-6x over the run"),
    "leak_oom_crash": ("leak", leak_oom_crash, "linear leak into allocator retries, OOMs and a crash (no bye)"),
}


def build(shape: str, device: str, seed: int, cadences: Sequence[str] = ("fixed",)) -> Tuple[str, Dict[str, Tuple[List[str], Dict[str, Any]]]]:
    """(file name, {cadence: (lines, label)}): one simulated run, seen at each cadence."""
    kind, fill, what = SHAPES[shape]
    name = "%s_%s_s%d.jsonl" % (shape, device, seed)
    rng = Rng(seed_of(name))
    cfg = common(rng, device, shape, kind)
    fill(rng, cfg)
    sim = Sim(cfg, rng)
    sim.run()
    views = {}
    for cadence in cadences:
        # The same run either way: the adaptive trace is the fixed one as the client would thin it.
        lines = thin(sim.lines) if cadence == "adaptive" else sim.lines
        views[cadence] = (lines, label(name, what, cfg, sim, lines, cadence))
    return name, views


_FREE = re.compile(r'"device_free":(\d+)')
_RETRIES = re.compile(r'"num_alloc_retries":(\d+)')


def observe(lines: List[str]) -> Dict[str, int]:
    """What the trace shows: allocator retries in its samples, the least free memory in its samples
    and OOM events, sample counts. Labels are derived from this, so a thinned trace that never
    shows a retry does not expect near_limit. (Regexes, not json: lines are the simulator's own.)"""
    seen = {"retries": 0, "min_free": -1, "train": 0, "eval": 0}
    for line in lines:
        is_sample = '"type":"sample"' in line
        if not is_sample and '"kind":"oom"' not in line:
            continue
        free = _FREE.search(line)
        if free and (seen["min_free"] < 0 or int(free.group(1)) < seen["min_free"]):
            seen["min_free"] = int(free.group(1))
        if is_sample:
            retries = _RETRIES.search(line)
            seen["retries"] = max(seen["retries"], int(retries.group(1)) if retries else 0)
            seen["train" if '"phase":"train"' in line else "eval"] += 1
    return seen


def truth(cfg: Config, sim: Sim) -> Dict[str, Dict[str, Any]]:
    """When each expected condition really began (step, ts), whatever the trace samples: the
    reference for time- and steps-to-detect."""
    out: Dict[str, Dict[str, Any]] = {}
    if cfg.leak is not None:
        onset = cfg.leak["onset_step"]
        out["leak"] = {"step": onset, "ts": sim.end_ts[onset - 1]}
    if sim.first_retry is not None:
        out["near_limit"] = {"step": sim.first_retry[0], "ts": sim.first_retry[1]}
    if sim.first_oom_step is not None:
        out["oom"] = {"step": sim.first_oom_step, "ts": sim.first_oom_ts}
    if cfg.other_growth is not None:
        onset = cfg.other_growth["onset_step"]
        out["untracked_growth"] = {"step": onset, "ts": sim.end_ts[onset - 1]}
    if cfg.cache_growth is not None:
        onset = cfg.cache_growth["onset_step"]
        out["cache_growth"] = {"step": onset, "ts": sim.end_ts[onset - 1]}
    return out


def cache_full_step(cfg: Config, sim: Sim) -> Optional[int]:
    """The step at which the creeping cache would reach what the allocator can hold (device_free
    + reserved, as the daemon's limit), had the run gone on: from the run's last step."""
    g = cfg.cache_growth
    if g is None:
        return None
    reserved = sim.reserved + sim.held
    return sim.last_step + (cfg.total - sim.outside - reserved) // g["bytes_per_step"]


def label(name: str, what: str, cfg: Config, sim: Sim, lines: List[str], cadence: str) -> Dict[str, Any]:
    total = cfg.total
    crashed = sim.crashed
    seen = observe(lines)
    expect: List[str] = []
    forbid: List[str] = []
    if cfg.kind == "leak":
        expect.append("leak")
    else:
        forbid.append("leak")
    if seen["retries"] > 0:
        expect.append("near_limit")
    if sim.ooms > 0:
        expect.append("oom")
    else:
        forbid.append("oom")
    if crashed:
        expect.append("crash")
    else:
        forbid.append("crash")
    if seen["retries"] == 0 and seen["min_free"] >= 0.2 * total:
        forbid += ["near_limit", "fragmentation"]
    if cfg.other_growth is not None:
        expect.append("untracked_growth")
    else:
        forbid.append("untracked_growth")
    if cfg.cache_growth is not None:
        expect.append("cache_growth")
    else:
        forbid.append("cache_growth")
    check_intent(cfg, sim, expect)

    limit = cfg.usable()
    extra = cfg.peak_extra_max()
    oom_step = None
    if cfg.leak is not None:
        oom_step = sim.first_oom_step if cfg.oom_policy == "crash" and sim.first_oom_step else fm.first_crossing(cfg.leak, extra, limit)
    lab: Dict[str, Any] = {
        "file": name,
        "shape": cfg.shape,
        "kind": cfg.kind,
        "description": what,
        "device": DEVICES["a100" if total < 50 * GB else "h100"]["name"],
        "device_total": total,
        "expect": expect,
        "forbid": forbid,
        "leak_onset_step": cfg.leak["onset_step"] if cfg.leak else None,
        "floor_at_onset_bytes": fm.floor_bytes(cfg.leak, cfg.leak["onset_step"]) if cfg.leak else None,
        "floor_model": cfg.leak,
        "oom_step": oom_step,
        "oom_limit_bytes": limit,
        "peak_extra_max_bytes": extra,
        "growth_budget_bytes": fm.growth_budget(total),
        "step_seconds": round(sim.train_time / max(1, sim.train_steps), 4),
        "sample_every": cfg.every,
        "cadence": cadence,
        "truth": {k: v for k, v in truth(cfg, sim).items() if k in expect},
        "last_step": sim.last_step,
        "train_samples": seen["train"],
        "eval_samples": seen["eval"],
        "ended": "crash" if crashed else "bye",
        "warmup_end_step": warmup_end(cfg),
        "retries_seen": seen["retries"],
        "ooms": sim.ooms,
        "first_oom_step": sim.first_oom_step,
        "eval_period": cfg.eval["period"] if cfg.eval else None,
        "checkpoint_period": cfg.ckpt["period"] if cfg.ckpt else None,
        "accum_period": cfg.accum["k"] if cfg.accum else None,
        "level_shift_step": cfg.shifts[0][0] if cfg.shifts else None,
        "drift_model": cfg.drift,
        "outside_steps": cfg.other_steps or None,
        "outside_growth": cfg.other_growth,
        "cache_steps": cfg.cache_steps or None,
        "cache_growth": cfg.cache_growth,
        "cache_full_step": cache_full_step(cfg, sim),
        "varlen": cfg.varlen is not None,
        "expandable_segments": cfg.expandable,
    }
    return lab


def check_intent(cfg: Config, sim: Sim, expect: List[str]) -> None:
    """Each shape must show what it is for; a parameter draw that misses is a generator bug."""
    where = "%s (seed stream %s)" % (cfg.shape, cfg.hello["gpu_uuid"])
    if cfg.shape in ("near_limit", "oom_recovered"):
        if sim.retries_seen < 3:
            raise RuntimeError("%s: only %d allocator retries seen" % (where, sim.retries_seen))
    elif cfg.shape == "leak_oom_crash":
        if not (sim.crashed and sim.first_oom_step and sim.retries_seen > 0):
            raise RuntimeError("%s: did not retry, OOM and crash (ooms=%d)" % (where, sim.ooms))
    elif sim.retries or sim.ooms:
        raise RuntimeError("%s: unexpected retries=%d ooms=%d" % (where, sim.retries, sim.ooms))
    if cfg.shape == "oom_recovered" and (sim.ooms == 0 or sim.crashed):
        raise RuntimeError("%s: expected a recovered OOM" % where)
    if cfg.leak is not None and sim.first_oom_step is None:
        grown = fm.growth_at(cfg.leak, sim.last_step)
        if grown < 2 * fm.growth_budget(cfg.total):
            raise RuntimeError("%s: the leak grows only %d bytes over the run" % (where, grown))


def write(out_dirs: Dict[str, str], shapes: Sequence[str]) -> Dict[str, Tuple[int, int]]:
    """Writes each cadence's traces and labels.json into its directory: {cadence: (traces, bytes)}."""
    labels: Dict[str, List[Dict[str, Any]]] = {c: [] for c in out_dirs}
    sizes = {c: 0 for c in out_dirs}
    for d in out_dirs.values():
        os.makedirs(d, exist_ok=True)
    for shape in shapes:
        for device, seed in INSTANCES:
            name, views = build(shape, device, seed, tuple(out_dirs))
            for cadence, (lines, lab) in views.items():
                data = ("\n".join(lines) + "\n").encode("utf-8")
                with open(os.path.join(out_dirs[cadence], name), "wb") as f:
                    f.write(data)
                sizes[cadence] += len(data)
                labels[cadence].append(lab)
    for cadence, d in out_dirs.items():
        with open(os.path.join(d, "labels.json"), "w", encoding="utf-8") as f:
            json.dump({"version": 1, "traces": labels[cadence]}, f, indent=1)
            f.write("\n")
    return {c: (len(labels[c]), sizes[c]) for c in out_dirs}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("out_dir", help="directory to write the traces and labels.json into (created if missing)")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="only these shapes (repeatable)")
    ap.add_argument(
        "--cadence",
        choices=CADENCES + ("both",),
        default="fixed",
        help="fixed: a train sample every `sample_every` steps (attach(every=N) with max_rate and budget off); "
        "adaptive: the same runs thinned as the client's default cadence would (cadence.py); "
        "both: OUT_DIR/fixed and OUT_DIR/adaptive from one simulation",
    )
    args = ap.parse_args(argv)
    shapes = args.shape or list(SHAPES)
    if args.cadence == "both":
        out_dirs = {c: os.path.join(args.out_dir, c) for c in CADENCES}
    else:
        out_dirs = {args.cadence: args.out_dir}
    start = time.monotonic()
    written = write(out_dirs, shapes)
    for cadence, (count, size) in written.items():
        print(
            "wrote %d traces (%.1f MB, %s cadence) and labels.json to %s in %.1f s"
            % (count, size / 1e6, cadence, out_dirs[cadence], time.monotonic() - start),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
