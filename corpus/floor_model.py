"""The noise-free train floor of a corpus trace, shared by generate.py and evaluate.py.

generate.py draws every trace's per-step floor (`allocated_bytes.all.current` on train samples,
before noise, accumulation and spikes) from these functions, and labels.json carries the same
parameters, so evaluate.py recomputes the floor at any step exactly, in integer arithmetic.

A label's `floor_model` is
    {"base_bytes": B, "onset_step": S0, "leak": {...}}
and floor(step) = B + leak(step), with leak(step) == 0 for step <= S0. Leak kinds:
    linear        {"bytes_per_step": R}                      R * (step - S0)
    accelerating  {"bytes_per_step": R0,                     per-step growth rises linearly from
                   "bytes_per_step_at_ramp_end": R1,         R0 at S0 to R1 at S0 + T and on past it
                   "ramp_steps": T}                          (quadratic total)
    periodic      {"first_jump_step": J1, "period": P,       J more at J1, J1 + P, J1 + 2P, ...
                   "jump_bytes": J}
All byte amounts are multiples of 512 (the allocator's rounding), so floors are too.
"""

from typing import Any, Dict, Mapping

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10
BLOCK = 512  # the caching allocator rounds every allocation up to 512 bytes


def growth_budget(device_total: int) -> int:
    """How much the floor may grow past its value at onset before a leak must have been flagged."""
    return max(2 * GIB, (3 * device_total) // 100)


def leak_bytes(model: Mapping[str, Any], step: int) -> int:
    """Bytes leaked by `step` (0 at and before the onset step)."""
    leak = model["leak"]
    onset = int(model["onset_step"])
    kind = leak["type"]
    if kind == "linear":
        return int(leak["bytes_per_step"]) * max(0, step - onset)
    if kind == "accelerating":
        t = max(0, step - onset)
        r0 = int(leak["bytes_per_step"]) // BLOCK
        r1 = int(leak["bytes_per_step_at_ramp_end"]) // BLOCK
        ramp = int(leak["ramp_steps"])
        # Sum of a per-step size that rises linearly, in 512-byte units so the total stays aligned.
        return BLOCK * ((2 * ramp * r0 * t + (r1 - r0) * t * t) // (2 * ramp))
    if kind == "periodic":
        first = int(leak["first_jump_step"])
        if step < first:
            return 0
        return int(leak["jump_bytes"]) * ((step - first) // int(leak["period"]) + 1)
    raise ValueError("unknown leak type %r in floor_model (expected linear, accelerating or periodic)" % kind)


def floor_bytes(model: Mapping[str, Any], step: int) -> int:
    """The noise-free train floor at `step`, for steps at or after the onset."""
    return int(model["base_bytes"]) + leak_bytes(model, step)


def growth_at(model: Mapping[str, Any], step: int) -> int:
    """floor(step) - floor(onset): how far the leak had grown when it was flagged at `step`."""
    return floor_bytes(model, step) - floor_bytes(model, int(model["onset_step"]))


def first_crossing(model: Mapping[str, Any], extra_bytes: int, limit_bytes: int, horizon: int = 10**9) -> Any:
    """First step >= onset at which floor + extra_bytes reaches limit_bytes, or None before horizon.

    Leak floors never decrease, so an exponential search then a bisection finds it.
    """
    onset = int(model["onset_step"])

    def over(step: int) -> bool:
        return floor_bytes(model, step) + extra_bytes >= limit_bytes

    if over(onset):
        return onset
    hi = 1
    while not over(onset + hi):
        hi *= 2
        if hi > horizon:
            return None
    lo = hi // 2  # over(onset + lo) is False (or lo == 0 and onset itself was checked)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if over(onset + mid):
            hi = mid
        else:
            lo = mid
    return onset + hi


def describe(model: Dict[str, Any]) -> str:
    leak = model["leak"]
    if leak["type"] == "linear":
        return "%.0f KiB/step" % (leak["bytes_per_step"] / KIB)
    if leak["type"] == "accelerating":
        return "%.0f -> %.0f KiB/step over %d steps" % (
            leak["bytes_per_step"] / KIB,
            leak["bytes_per_step_at_ramp_end"] / KIB,
            leak["ramp_steps"],
        )
    return "%.0f MiB every %d steps" % (leak["jump_bytes"] / MIB, leak["period"])
