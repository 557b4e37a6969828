"""One simulated training process: its caching allocator, its clock and the trace lines it sends.

The simulation runs every training step (so allocator state, retries and step times evolve
per step) and writes a sample every `every` steps, as `attach(every=N)` does. The peak in a
sample is the highest within-step peak since the previous sample, as a client that calls
reset_peak_memory_stats() after each sample would report.

Only random.Random.random() and integer/float arithmetic are used (no math.log/exp/cos), so the
output is byte-identical on every platform and Python version.
"""

import json
import random
from typing import Any, Dict, List, Optional, Set, Tuple

import floor_model as fm

MIB = fm.MIB
SEGMENT = 2 * MIB  # reserved memory grows in multiples of the large-pool rounding
POLL_SECONDS = 1.0  # the daemon's NVML poll interval (its default)
RENOTE_SECONDS = 30.0  # the recorder notes an unchanged figure again after this long


def q512(x: float) -> int:
    return int(x) // fm.BLOCK * fm.BLOCK


def up2m(x: float) -> int:
    return -(-int(x) // SEGMENT) * SEGMENT


def human(n: int) -> str:
    """The allocator's wording ("2.00 GiB"), as torch and the Python client print sizes."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return "%d bytes" % n if unit == "bytes" else "%.2f %s" % (value, unit)
        value /= 1024
    return "%d bytes" % n


class Rng:
    """Draws from random.Random.random() only: stable across Python versions and platforms."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def u(self, a: float = 0.0, b: float = 1.0) -> float:
        return a + (b - a) * self._r.random()

    def normal(self) -> float:
        # Irwin-Hall: sum of 12 uniforms, mean 0, variance 1, bounded to +-6.
        r = self._r.random
        return r() + r() + r() + r() + r() + r() + r() + r() + r() + r() + r() + r() - 6.0

    def clipped_normal(self, bound: float = 3.0) -> float:
        return max(-bound, min(bound, self.normal()))

    def chance(self, p: float) -> bool:
        return self._r.random() < p

    def int(self, a: int, b: int) -> int:
        """Uniform integer in [a, b]."""
        return min(b, a + int(self._r.random() * (b - a + 1)))

    def pick(self, seq: List[Any]) -> Any:
        return seq[min(len(seq) - 1, int(self._r.random() * len(seq)))]


class Config:
    """Everything that shapes one trace. generate.py's shape functions fill it in."""

    def __init__(self, **kw: Any) -> None:
        self.shape = ""
        self.total = 0
        self.other = 0  # CUDA context, NCCL, cuBLAS handles: device memory outside the allocator
        # More of it as the run goes, by step: [[step, bytes], ...], a step function (NCCL's
        # warm-up, a one-time workspace), and {"onset_step", "bytes_per_step"}, linear growth
        # (communicators made per step: the untracked_growth shapes).
        self.other_steps: List[List[int]] = []
        self.other_growth: Optional[Dict[str, int]] = None
        # Cache the allocator keeps reserved and never hands out again, by step: [[step, bytes],
        # ...], a step function (CUDA graph pools, an evaluation's or the longest batch's
        # shapes), and {"onset_step", "bytes_per_step"}, a creep (the cache_growth shapes:
        # torch issue #123548). Reported in reserved and missing from device_free.
        self.cache_steps: List[List[int]] = []
        self.cache_growth: Optional[Dict[str, int]] = None
        self.steps = 1000
        self.every = 1
        self.step_time = 0.5
        self.jitter = 0.06
        self.stall_p = 0.001
        self.warmup: List[List[Any]] = []  # [step, bytes, extra seconds]
        self.shifts: List[List[Any]] = []  # [step, bytes, act scale, time scale]
        self.leak: Optional[Dict[str, Any]] = None  # a floor_model dict
        self.drift: Optional[Dict[str, Any]] = None  # immaterial growth, same form as leak
        self.act0 = 0  # within-step activation peak above the floor (fixed batch shapes)
        self.floor_jitter_blocks = 0  # per-step retained tensors of slightly varying size
        self.varlen: Optional[Dict[str, Any]] = None  # ret_max, act_max, quad, skew, min_x
        self.accum: Optional[Dict[str, Any]] = None  # k, grads, per_micro
        self.eval: Optional[Dict[str, Any]] = None
        self.ckpt: Optional[Dict[str, Any]] = None
        self.spikes: Optional[Dict[str, Any]] = None
        self.frag = 0.05
        self.frag_final = 0.05  # fragmentation drifts from frag to frag_final over frag_steps
        self.frag_steps = 1
        self.frag_ramp = 50  # steps after a cache flush for fragmentation to build back up
        self.min_frag = 0.004
        self.split_share = 0.2
        self.rho = 0.001
        self.oom_policy = "crash"
        self.max_ooms = 1
        self.giant_steps: Dict[int, float] = {}
        self.end_crash_step: Optional[int] = None
        self.expandable = False
        self.hello: Dict[str, Any] = {}
        self.ts0 = 1762000000.0
        self.__dict__.update(kw)

    def usable(self) -> int:
        return self.total - self.other

    def peak_extra_max(self) -> int:
        """Largest within-step peak above the noise-free floor on ordinary train steps.

        Rare spikes, checkpoint gathers and deliberately giant batches are left out: they are
        one-offs, not the level an OOM forecast extrapolates.
        """
        scale = max([1.0] + [s[2] for s in self.shifts])
        if self.varlen is not None:
            v = self.varlen
            extra = v["ret_max"] + int(v["act_max"] * scale)
        else:
            extra = q512(self.act0 * scale * 1.012) + self.floor_jitter_blocks * fm.BLOCK
        if self.accum is not None:
            a = self.accum
            extra += a["grads"] + (a["k"] - 1) * a["per_micro"]
        return extra


class Sim:
    def __init__(self, cfg: Config, rng: Rng) -> None:
        self.c = cfg
        self.rng = rng
        self.lines: List[str] = []
        self.ts = cfg.ts0
        self.usable2m = cfg.usable() // SEGMENT * SEGMENT
        self.usable2m_base = self.usable2m
        self.held = 0  # cache reserved for good (cache_steps, cache_growth)
        self.reserved = 0
        self.since_flush = 0
        self.retries = 0
        self.ooms = 0
        self.syncs = 0
        self.dev_alloc = 0
        self.dev_free = 0
        self.prev_excess = 0
        self.window_peak = 0  # highest peak since the last sample
        self.pending_peak = 0  # extra for the next step's peak (checkpoint gather)
        self.train_time = 0.0
        self.train_steps = 0
        self.first_oom_step: Optional[int] = None
        self.crashed = False
        self.min_free = cfg.total
        self.last_step = 0
        self.samples = 0
        self.eval_samples = 0
        self.giants_done: Set[int] = set()
        self.retries_seen = 0
        self.end_ts: List[float] = []  # end of each completed train step: end_ts[step - 1]
        self.first_retry: Optional[List[Any]] = None  # [step, ts] of the first allocator retry
        self.first_oom_ts: Optional[float] = None
        self._warm = sorted(cfg.warmup)
        self._shifts = sorted(cfg.shifts)
        # NVML's per-process figure as the daemon polls it and its recorder notes it.
        self.next_poll: Optional[float] = None
        self.noted: Optional[Tuple[int, float]] = None
        self.outside = cfg.other  # memory outside the allocator now

    # --- memory model -------------------------------------------------------------------
    def base(self, step: int) -> int:
        b = 0
        for s, nbytes, _ in self._warm:
            if s <= step:
                b += nbytes
        for s, nbytes, _, _ in self._shifts:
            if s <= step:
                b += nbytes
        return b

    def floor_true(self, step: int) -> int:
        f = self.base(step)
        if self.c.leak is not None:
            f += fm.leak_bytes(self.c.leak, step)
        if self.c.drift is not None:
            f += fm.leak_bytes(self.c.drift, step)
        return f

    def regime(self, step: int) -> List[float]:
        act_scale, time_scale = 1.0, 1.0
        for s, _, a, t in self._shifts:
            if s <= step:
                act_scale, time_scale = a, t
        return [act_scale, time_scale]

    def frag_at(self, step: int) -> float:
        c = self.c
        done = min(1.0, step / float(c.frag_steps))
        target = c.frag + (c.frag_final - c.frag) * done
        return target * min(1.0, self.since_flush / c.frag_ramp)

    def draw_batch(self, step: int, act_scale: float) -> List[int]:
        """(retained bytes at the step boundary, activation peak) for one batch."""
        c = self.c
        if c.varlen is not None:
            v = c.varlen
            x = v["min_x"] + (1.0 - v["min_x"]) * self.skewed(v["skew"])
            ret = q512(v["ret_max"] * x)
            act = v["act_max"] * ((1.0 - v["quad"]) * x + v["quad"] * x * x)
        else:
            ret = fm.BLOCK * self.rng.int(0, c.floor_jitter_blocks) if c.floor_jitter_blocks else 0
            act = c.act0 * (1.0 + 0.004 * self.rng.clipped_normal())
        return [ret, q512(act * act_scale)]

    def skewed(self, skew: float) -> float:
        """u ** skew for skew >= 1, blended between integer powers: multiplications only (no libm pow)."""
        u = self.rng.u()
        whole = int(skew)
        low = 1.0
        for _ in range(whole):
            low *= u
        w = skew - whole
        return (1.0 - w) * low + w * low * u

    def grow(self, step: int, peak: int) -> bool:
        """The allocator serving one step whose peak is `peak`. False: out of memory."""
        if up2m(peak) > self.usable2m:
            return False
        self.since_flush += 1
        need = up2m(peak * (1.0 + self.frag_at(step)))
        if need > self.reserved:
            if need <= self.usable2m:
                # A new segment sized for the request that did not fit, not just the shortfall.
                grown = min(self.usable2m, max(need, self.reserved + up2m(self.rng.u(20, 256) * MIB)))
                self.dev_alloc += 1 + (grown - self.reserved) // (256 * MIB)
                self.reserved = grown
            else:
                # cudaMalloc failed: free every cached block and try again (num_alloc_retries).
                self.retries += 1
                self.note_retry(step)
                self.syncs += 1
                self.dev_free += 1 + max(0, self.reserved - peak) // (64 * MIB)
                self.reserved = min(self.usable2m, up2m(peak * (1.0 + self.c.min_frag)))
                self.dev_alloc += 1
                self.since_flush = 0
        return True

    def note_retry(self, step: int) -> None:
        if self.first_retry is None:
            self.first_retry = [step, self.now()]

    def empty_cache(self, alloc: int) -> None:
        target = up2m(alloc)
        if target < self.reserved:
            self.dev_free += 1 + (self.reserved - target) // (64 * MIB)
            self.reserved = target
        self.syncs += 1
        self.since_flush = 0

    def outside_at(self, step: int) -> int:
        """Device memory outside the allocator after `step`: the context and the like, plus
        what the shape adds."""
        c = self.c
        extra = sum(b for st, b in c.other_steps if step >= st)
        g = c.other_growth
        if g is not None and step > g["onset_step"]:
            extra += (step - g["onset_step"]) * g["bytes_per_step"]
        return c.other + extra

    def held_at(self, step: int) -> int:
        """Cache reserved for good after `step`: what the shape holds back from reuse."""
        c = self.c
        held = sum(b for st, b in c.cache_steps if step >= st)
        g = c.cache_growth
        if g is not None and step > g["onset_step"]:
            held += (step - g["onset_step"]) * g["bytes_per_step"]
        return held

    def poll(self) -> None:
        """NVML polls up to now (every POLL_SECONDS): a `trace_nvml` line, as the daemon's
        recorder writes one, when the figure changed or was noted RENOTE_SECONDS ago."""
        if self.next_poll is None:
            self.next_poll = self.ts
        used = self.reserved + self.held + self.outside
        while self.next_poll <= self.ts:
            ts = round(self.next_poll, 3)
            if self.noted is None or self.noted[0] != used or ts - self.noted[1] >= RENOTE_SECONDS:
                self.emit({"type": "trace_nvml", "used_bytes": used, "ts": ts})
                self.noted = (used, ts)
            self.next_poll += POLL_SECONDS

    # --- lines ------------------------------------------------------------------------------
    def emit(self, msg: Dict[str, Any]) -> None:
        self.lines.append(json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False))

    def now(self) -> float:
        return round(self.ts, 3)

    def sample(self, step: int, phase: str, alloc: int) -> None:
        c = self.c
        self.reserved = max(self.reserved, up2m(self.window_peak))
        reserved = self.reserved + self.held
        slack = reserved - alloc
        split = q512(slack * c.split_share * (0.8 + 0.4 * self.rng.u()))
        requested = alloc - (int(alloc * c.rho * (0.9 + 0.2 * self.rng.u())) // 8 * 8)
        free = c.total - self.outside - reserved
        self.min_free = min(self.min_free, free)
        stats = {
            "allocated_bytes.all.current": alloc,
            "allocated_bytes.all.peak": self.window_peak,
            "reserved_bytes.all.current": reserved,
            "active_bytes.all.current": alloc,
            "inactive_split_bytes.all.current": split,
            "requested_bytes.all.current": requested,
            "num_alloc_retries": self.retries,
            "num_ooms": self.ooms,
            "num_sync_all_streams": self.syncs,
            "num_device_alloc": self.dev_alloc,
            "num_device_free": self.dev_free,
        }
        self.emit(
            {
                "type": "sample",
                "ts": self.now(),
                "step": step,
                "phase": phase,
                "stats": stats,
                "device_free": free,
                "device_total": c.total,
            }
        )
        self.window_peak = 0
        self.retries_seen = self.retries
        if phase == "train":
            self.samples += 1
        else:
            self.eval_samples += 1

    def event(self, kind: str, **fields: Any) -> None:
        msg: Dict[str, Any] = {"type": "event", "ts": self.now(), "kind": kind}
        msg.update(fields)
        self.emit(msg)

    # --- the run ------------------------------------------------------------------------------
    def step_seconds(self, time_scale: float) -> float:
        c = self.c
        dt = c.step_time * time_scale * (1.0 + c.jitter * self.rng.clipped_normal())
        if self.rng.chance(c.stall_p):
            dt += self.rng.u(1.0, 6.0)  # a data-loader stall
        return dt

    def run(self) -> None:
        c = self.c
        self.emit(dict(c.hello))
        self.dev_alloc = self.rng.int(40, 400)  # small-pool segments from moving the model over
        self.ts += self.rng.u(20.0, 90.0)  # model load and first batch before step 1
        extra_time = {int(s): float(t) for s, _, t in c.warmup}
        step = 0
        while step < c.steps:
            s = step + 1
            if c.end_crash_step is not None and s > c.end_crash_step:
                self.crashed = True  # killed (preempted): no bye
                return
            act_scale, time_scale = self.regime(s)
            dt = self.step_seconds(time_scale)
            floor = self.floor_true(s)
            ret, act = self.draw_batch(s, act_scale)
            if s in c.giant_steps and s not in self.giants_done:
                # A pathological batch (the longest sequence, oversized): it runs out of memory once.
                self.giants_done.add(s)
                top = c.varlen["act_max"] if c.varlen is not None else c.act0
                act = q512(top * act_scale * c.giant_steps[s])
            excess = ret
            if c.accum is not None:
                a = c.accum
                i = s % a["k"]  # i == 0: the optimizer stepped and zero_grad freed the gradients
                if i:
                    excess += a["grads"] + (i - 1) * a["per_micro"]
            if c.spikes is not None:
                sp = c.spikes
                if self.rng.chance(sp["floor_p"]):
                    excess += q512(self.rng.u(*sp["floor_range"]))
                if self.rng.chance(sp["peak_p"]):
                    act += q512(act * self.rng.u(*sp["peak_range"]))
            alloc = floor + excess
            peak = floor + max(self.prev_excess, excess) + act + self.pending_peak
            if not self.grow(s, peak):
                self.out_of_memory(s, floor, act, dt)
                if self.crashed:
                    return
                continue
            self.pending_peak = 0
            self.prev_excess = excess
            self.window_peak = max(self.window_peak, peak)
            self.ts += dt + extra_time.get(s, 0.0)
            self.outside = self.outside_at(s)
            self.held = self.held_at(s)
            self.usable2m = self.usable2m_base - self.held
            self.poll()
            self.train_time += dt
            self.train_steps += 1
            step = s
            self.last_step = s
            self.end_ts.append(self.now())
            if s % c.every == 0:
                self.sample(s, "train", alloc)
            if c.eval is not None and s % c.eval["period"] == 0:
                self.run_eval(s, floor)
            if c.ckpt is not None and s % c.ckpt["period"] == 0:
                self.checkpoint(s, alloc)
        self.ts += self.rng.u(0.5, 3.0)
        self.emit({"type": "bye", "ts": self.now()})

    def out_of_memory(self, s: int, floor: int, act: int, dt: float) -> None:
        """The allocator's retry failed: an `oom` event, then the trainer skips the batch or dies."""
        c = self.c
        self.ts += dt * self.rng.u(0.3, 0.8)  # the step got part way through its forward/backward
        self.retries += 1
        self.note_retry(s)
        self.syncs += 1
        self.dev_free += 1
        self.ooms += 1
        request = up2m(act * self.rng.u(0.06, 0.2))
        gap = min(request - SEGMENT, up2m(self.rng.u(20, 700) * MIB))
        held = self.usable2m - gap
        free = c.total - self.outside - held
        in_use = c.total - free
        allocated = min(held - SEGMENT, q512(floor + act * self.rng.u(0.6, 0.9)))
        detail = (
            "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is free. "
            "Including non-PyTorch memory, this process has %s memory in use. Of the allocated memory %s is "
            "allocated by PyTorch, and %s is reserved by PyTorch but unallocated."
            % (
                human(request),
                int(c.hello.get("cuda_device", 0)),
                human(c.total),
                human(free),
                human(in_use),
                human(allocated),
                human(held - allocated),
            )
        )
        self.event("oom", alloc_bytes=request, device_free=free, detail=detail)
        self.min_free = min(self.min_free, free)
        if self.first_oom_step is None:
            self.first_oom_step = s
            self.first_oom_ts = self.now()
            if c.oom_policy == "crash":
                self.event("snapshot", path="oom_snapshots/rank%d_step%d.pickle" % (c.hello.get("rank", 0), s))
        if self.ooms >= c.max_ooms and c.oom_policy == "crash":
            self.crashed = True
            return
        # The trainer catches the error, frees the cache and skips the batch (fairseq-style).
        self.event("mark", detail="OOM at step %d: batch skipped after torch.cuda.empty_cache()" % s)
        self.empty_cache(floor + self.prev_excess)
        self.ts += self.rng.u(0.2, 1.0)

    def run_eval(self, s: int, train_floor: int) -> None:
        c = self.c
        ev = c.eval
        act_scale, time_scale = self.regime(s)
        self.ts += self.rng.u(0.05, 0.5)
        self.event("phase", phase="eval")
        n = ev["batches"]
        alloc = train_floor
        for b in range(1, n + 1):
            self.ts += self.step_seconds(time_scale * ev["time_scale"])
            transient = ev["transient"] * b + (ev.get("leak_jump", 0) * b // n) // fm.BLOCK * fm.BLOCK
            alloc = train_floor + transient
            _, act = self.draw_batch(s, act_scale * ev["act_scale"])
            peak = alloc + act
            # Eval shapes are kept below the limit by construction; an OOM here would be a bug.
            if not self.grow(s, peak):
                raise RuntimeError("eval batch over the device limit in %s" % c.shape)
            self.window_peak = max(self.window_peak, peak)
            self.sample(s, "eval", alloc)
        self.ts += self.rng.u(0.05, 0.5)
        self.event("phase", phase="train")
        if ev.get("empty_cache"):
            self.empty_cache(train_floor + ev.get("leak_jump", 0))
        self.prev_excess = 0

    def checkpoint(self, s: int, alloc: int) -> None:
        ck = self.c.ckpt
        self.ts += self.rng.u(*ck["pause"])
        self.event("mark", detail="checkpoint saved: step %d" % s)
        self.pending_peak = ck["gather"]
        if ck.get("empty_cache"):
            self.empty_cache(alloc)
