"""The batch that fits, predicted and then found by trying. A small transformer language model
(token embedding, pre-norm encoder layers with 4x feed-forward, LayerNorm, a vocabulary head;
fp32, AdamW, no dropout) on GPU 0, its caching allocator capped with
torch.cuda.set_per_process_memory_fraction (4 GiB by default). Activations dominate: at the
default batch of 48 sequences of 256 tokens they are some 1 GiB against some 70 MiB of
parameters, gradients and optimizer state.

--mode predict: attached to gpumon with gpumon_client.attach(), trains at --batch for --seconds,
resetting the allocator's peak at the start of every step so that the sample's
`allocated_bytes.all.peak` is that step's peak (design/categories.md); the client measures the
split on step 3 and the daemon predicts the largest safe batch from it. Writes every step's
allocator peak (torch.cuda.max_memory_allocated after optimizer.step) for the driver to hold
the split against.

--mode search: the truth, without gpumon, in a fresh process under the same cap: the largest
batch that really runs --steps-per-try training steps. Doubling from --batch until a batch runs
out of memory, then bisecting; each try catches torch.cuda.OutOfMemoryError and empties the
cache before the next. --also-try N tries batch N on its own at the end (the driver passes the
prediction), so that a prediction that runs out of memory is seen directly.

On CPU (the self-test) nothing runs out of memory, so the allocator is simulated from the model:
a step peaks at 4x the parameter bytes (parameters, gradients, AdamW's two moments) plus 1.25x
the activations autograd saves at the batch (a quarter more of temporaries), measured here on the
real tensors; a try whose simulated peak is over the cap raises OutOfMemoryError. The CPU run
checks the plumbing (the split, the daemon's prediction, the search, the verdict), not the
prediction's accuracy, which only a real allocator can show."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import trainer_common as tc

# Steps of the predict run whose allocator peaks are written (the split is measured on step 3,
# then at most every few minutes).
KEEP_PEAKS = 4096
# CPU simulation: temporaries as a share of the activations, and the allocator's rounding.
SIM_TEMPORARIES = 0.25
SIM_ROUND = 2 * tc.MIB


def largest_fitting(
    fits: Callable[[int], bool], start: int, ceiling: int, out_of_time: Callable[[], bool] = lambda: False
) -> Tuple[int, Optional[int], bool]:
    """The largest batch for which `fits` holds, assuming that a batch that fits fits every
    smaller one: doubling from `start` until a batch fails, then bisecting. Returns (largest that
    fit, 0 when none did; smallest that failed, None when every batch up to `ceiling` fit;
    whether the search finished before `out_of_time`)."""
    lo, hi = 0, None
    b = max(1, min(start, ceiling))
    while hi is None:
        if out_of_time():
            return lo, hi, False
        if fits(b):
            lo = b
            if b >= ceiling:
                return lo, None, True
            b = min(2 * b, ceiling)
        else:
            hi = b
    while hi - lo > 1:
        if out_of_time():
            return lo, hi, False
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi, True


def build(torch: Any, args: Any, device: Any) -> Any:
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.width)
            self.pos = nn.Parameter(torch.zeros(args.seq, args.width))
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    args.width, args.heads, 4 * args.width, dropout=0.0, batch_first=True, norm_first=True
                )
                for _ in range(args.layers)
            )
            self.norm = nn.LayerNorm(args.width)
            self.head = nn.Linear(args.width, args.vocab)

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return TinyLM().to(device)


class Trainer:
    """The model, its optimizer and one training step at any batch size."""

    def __init__(self, torch: Any, args: Any, device: Any) -> None:
        self.torch, self.args, self.device = torch, args, device
        self.model = build(torch, args, device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.sim: Optional[SimAllocator] = None

    def batch(self, b: int) -> Tuple[Any, Any]:
        t, a = self.torch, self.args
        ids = t.randint(a.vocab, (b, a.seq), device=self.device)
        return ids, t.randint(a.vocab, (b, a.seq), device=self.device)

    def loss(self, ids: Any, targets: Any) -> Any:
        logits = self.model(ids)
        return self.torch.nn.functional.cross_entropy(logits.reshape(-1, self.args.vocab), targets.reshape(-1))

    def step(self, b: int) -> int:
        """One training step at batch `b`; returns the allocator's peak over it (the simulated
        one on CPU). Raises OutOfMemoryError (a simulated one on CPU) when the batch does not fit."""
        torch = self.torch
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.sim is not None and self.sim.step_peak(b) > self.sim.cap:
            raise torch.cuda.OutOfMemoryError(
                "simulated: a step at batch %d peaks at %d bytes, over the %d byte cap" % (b, self.sim.step_peak(b), self.sim.cap))
        ids, targets = self.batch(b)
        self.loss(ids, targets).backward()
        self.opt.step()
        peak = int(torch.cuda.max_memory_allocated(self.device)) if cuda else self.sim.step_peak(b) if self.sim else 0
        self.opt.zero_grad(set_to_none=True)
        return peak

    def saved_bytes(self, b: int) -> int:
        """What autograd saves for backward in one forward and loss at batch `b` (parameters
        excluded, each storage once): the activations, for the CPU simulation."""
        torch = self.torch
        params = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        seen: Dict[int, int] = {}

        def pack(t: Any) -> Any:
            s = t.untyped_storage()
            if s.data_ptr() not in params:
                seen[s.data_ptr()] = s.nbytes()
            return t

        ids, targets = self.batch(b)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.loss(ids, targets)
        return sum(seen.values())


class SimAllocator:
    """CPU self-test only: the allocator's figures of a step that peaks at `fixed` plus
    `per_sample` bytes per sample, under `cap`, for the client (a stats source) and for the
    search (`step_peak`)."""

    def __init__(self, fixed: int, per_sample: int, batch: int, cap: int, total: int, uuid: Optional[str]) -> None:
        self.fixed, self.per_sample, self.batch, self.cap, self.total, self.uuid = fixed, per_sample, batch, cap, total, uuid

    def step_peak(self, b: int) -> int:
        return self.fixed + self.per_sample * b

    def _reserved(self) -> int:
        return -(-self.step_peak(self.batch) // SIM_ROUND) * SIM_ROUND

    def device_info(self) -> Dict[str, Any]:
        return {"cuda_device": 0, "gpu_uuid": self.uuid, "torch": "cpu-sim", "alloc_limit": self.cap}

    def memory_stats(self) -> Dict[str, Any]:
        reserved = self._reserved()
        return {
            "allocated_bytes.all.current": self.fixed,
            "allocated_bytes.all.peak": self.step_peak(self.batch),
            "reserved_bytes.all.current": reserved,
            "reserved_bytes.all.peak": reserved,
            "active_bytes.all.current": self.fixed,
            "inactive_split_bytes.all.current": 0,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    def mem_get_info(self) -> Tuple[int, int]:
        return (self.total - self._reserved(), self.total)

    def alloc_limit(self) -> int:
        return self.cap

    def tensor_device(self) -> str:
        return "cpu"  # the split counts the CPU tensors the self-test trains


def simulate(trainer: Trainer, batch: int, cap: int, total: int) -> SimAllocator:
    import os

    act = trainer.saved_bytes(batch)
    per_sample = int(act * (1 + SIM_TEMPORARIES)) // batch + 1
    sim = SimAllocator(4 * trainer.param_bytes, per_sample, batch, cap, total, os.environ.get("GPU_CHECK_SIM_UUID") or None)
    trainer.sim = sim
    return sim


def predict(args: Any, p: Any) -> None:
    torch_device = tc.setup(args)
    import torch

    cap, total = tc.cap_allocator(p, torch, torch_device, args.cap)
    trainer = Trainer(torch, args, torch_device)
    cpu = torch_device.type == "cpu"
    sim = simulate(trainer, args.batch, cap, total) if cpu else None
    import gpumon_client

    # Before the first step, so that the client's steps are this loop's (the split: step 3).
    # On CPU the source is the simulated allocator; the cost budget is off there (the
    # self-test's two cores run other trainers), as the launcher's --budget 0 does.
    handle = gpumon_client.attach(args.job, source=sim, **({"budget": None} if cpu else {}))
    if not handle.active:
        raise SystemExit("%s: gpumon_client.attach() is inactive: %s" % (tc.prog(), handle.reason or "?"))
    clock = tc.Clock(args.seconds, args.stop_file)
    peaks: List[int] = []
    reserved_peaks: List[int] = []
    steps = 0
    while clock.running():
        peak = trainer.step(args.batch)
        steps += 1
        if steps <= KEEP_PEAKS:
            peaks.append(peak)
            reserved_peaks.append(sim._reserved() if sim is not None else int(torch.cuda.max_memory_reserved(torch_device)))
        clock.pace(args.step_ms / 1000.0)
    tc.sync(torch, torch_device)
    gpumon_client.detach(timeout=2.0)
    tc.write_result(
        args.result,
        {
            "mode": "predict",
            "steps": steps,
            "seconds": clock.elapsed(),
            "cap": cap,
            "device_total": total,
            "batch": args.batch,
            "param_bytes": trainer.param_bytes,
            "peaks": peaks,
            "reserved_peaks": reserved_peaks,
            "sim": None if sim is None else {"fixed": sim.fixed, "per_sample": sim.per_sample},
            **tc.allocator_counters(torch, torch_device),
        },
    )


def search(args: Any, p: Any) -> None:
    torch_device = tc.setup(args)
    import torch

    cap, total = tc.cap_allocator(p, torch, torch_device, args.cap)
    trainer = Trainer(torch, args, torch_device)
    cpu = torch_device.type == "cpu"
    if cpu:
        simulate(trainer, args.batch, cap, total)
    clock = tc.Clock(args.seconds, args.stop_file)
    tries: List[Dict[str, Any]] = []

    def attempt(b: int) -> Dict[str, Any]:
        t0 = time.monotonic()
        error, peak = None, 0
        try:
            for _ in range(args.steps_per_try):
                peak = max(peak, trainer.step(b))
            tc.sync(torch, torch_device)
        except torch.cuda.OutOfMemoryError as exc:
            error = str(exc).splitlines()[0][:300]
        except RuntimeError as exc:
            # A library that allocates for itself (cuBLAS, cuDNN) and is refused says so in its
            # own words; that is the batch not fitting too. Anything else is a bug: raised.
            text = str(exc)
            if "out of memory" not in text.lower() and "ALLOC_FAILED" not in text:
                raise
            error = "%s: %s" % (type(exc).__name__, text.splitlines()[0][:300])
        # Out of the except clause: the traceback, and the batch's tensors its frames held, are
        # gone. A step cut short leaves gradients; freeing them and the cache makes the next try
        # start where a fresh trainer at that batch would.
        trainer.opt.zero_grad(set_to_none=True)
        reserved = int(torch.cuda.max_memory_reserved(torch_device)) if not cpu else 0
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(torch_device)
        entry = {"batch": b, "ok": error is None, "seconds": round(time.monotonic() - t0, 3),
                 "peak_allocated": peak if error is None else None, "peak_reserved": reserved or None, "error": error}
        tries.append(entry)
        print("batch %d: %s" % (b, "ran" if error is None else "out of memory"), flush=True)
        return entry

    # The first try at the batch the predict run trained at: AdamW's state is made then, as it was there.
    largest, failing, complete = largest_fitting(
        lambda b: attempt(b)["ok"], args.batch, args.max_batch, lambda: not clock.running())
    also = attempt(args.also_try) if args.also_try and clock.running() else None
    tc.write_result(
        args.result,
        {
            "mode": "search",
            "seconds": clock.elapsed(),
            "cap": cap,
            "device_total": total,
            "start_batch": args.batch,
            "steps_per_try": args.steps_per_try,
            "max_batch": args.max_batch,
            "largest": largest,
            "smallest_failing": failing,
            "complete": complete,
            "tries": tries,
            "also_tried": also,
            "param_bytes": trainer.param_bytes,
        },
    )


def main() -> None:
    p = tc.parser(__doc__, seconds=15)
    p.add_argument("--mode", choices=("predict", "search"), required=True)
    p.add_argument("--cap", type=tc.positive_float, default=4.0, help="allocator cap in GiB (default %(default)s)")
    p.add_argument("--batch", type=int, default=48, help="the batch trained at, and the search's start (default %(default)s)")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--step-ms", type=tc.positive_float, default=50.0, help="predict: step pacing")
    p.add_argument("--job", default="gpu-check-batch-fit", help="predict: the gpumon job name")
    p.add_argument("--steps-per-try", type=int, default=3, help="search: steps a batch must run")
    p.add_argument("--max-batch", type=int, default=1 << 16, help="search: the largest batch tried")
    p.add_argument("--also-try", type=int, default=None, help="search: a batch to try on its own at the end")
    args = p.parse_args()
    for flag in ("batch", "seq", "width", "layers", "heads", "vocab", "steps_per_try", "max_batch"):
        if getattr(args, flag) < 1:
            p.error("--%s must be 1 or more" % flag.replace("_", "-"))
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    if args.also_try is not None and args.also_try < 1:
        p.error("--also-try must be 1 or more")
    (predict if args.mode == "predict" else search)(args, p)


if __name__ == "__main__":
    main()
