"""The Python client's adaptive sampling cadence, replayed on a trace's train samples.

The client (`attach()` and its callbacks, defaults `every=1, max_rate=10, budget=0.005`) decides
at each training step whether to sample it:
  - at least `every` steps and 1 / `max_rate` seconds since the last sample;
  - and a cost budget for the client's whole cost, `budget * min(step time, 5 ms)` a step (at
    most 25 us): samples earn 3/5 of it as credit (at most 15 us a step; the rest pays for the
    step hook and a sample's aftermath, which the client does not time), a sample spends what it
    costs (here a fixed 120 us: `torch.cuda.memory_stats()` takes 70.5 us on an H100, plus
    building and sending the line), credit never exceeds one sample's cost, and a step is sampled
    only when the credit covers a sample;
  - the first step is always sampled; its cost is charged (the client charges it at most 250 us,
    though it also connects: more than the 120 us here, so the rule holds as is), but the client
    estimates a sample's cost (what the credit must cover) only from the second sample on;
  - the budget holds no sample back more than 5 minutes (the daemon closes a session silent for
    15); a sample that late is charged, but leaves at most one sample's debt;
  - it decides only at some steps: after each decision it skips the steps `every` rules out and
    7/8 of those the rate limit and the budget would rule out at the last gap's step time, and
    the next decision credits the skipped steps at their average time.
On steps of 12.5 ms or more that is one sample every 8 steps (samples at steps 1, 9, 25, 33, 41,
...: the second sample is due once the first is paid for, the third once the second is and the
credit covers one more); on faster steps the rate limit binds (one sample per 0.1 s).

`adaptive_keep` applies that rule to the (step, ts) of a trace's train samples. A trace sampled
every N steps is a client with `every=N`: the steps in between earn credit but cannot be sampled.
`thin` drops the train samples the rule skips from a trace's lines, carrying their peaks into the
next sample that is sent (the client resets the peak only when it sends one).
"""

import json
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

CADENCES = ("fixed", "adaptive")
# The client's defaults (clients/python/gpumon_client/cadence.py).
EVERY = 1
MAX_RATE = 10.0
BUDGET = 0.005
STEP_CAP_S = 0.005
# The share of the budget samples earn (the client's _SAMPLE_SHARE).
SAMPLE_SHARE = 0.6
SAMPLE_COST_S = 120e-6
# The longest the budget holds a sample back (the client's _MAX_GAP).
MAX_GAP_S = 300.0
# The share of the rate limit's and the budget's predicted steps a decision skips.
WAIT_SHARE = 0.875


def _ns(seconds: float) -> int:
    # Credit in integer nanoseconds: 8 x 15 us must equal 120 us exactly, not 119.99999 us.
    return int(round(seconds * 1e9))


def adaptive_keep(
    points: Iterable[Tuple[int, float]],
    every: int = EVERY,
    max_rate: Optional[float] = MAX_RATE,
    budget: Optional[float] = BUDGET,
    cost: float = SAMPLE_COST_S,
) -> List[bool]:
    """For candidate steps [(step, ts), ...] in order, whether the client samples each one.

    `step` is the training step count and `ts` the time it ended; steps absent from `points`
    (a trace sampled every N steps) earn credit like the others, at the average step time of
    their gap. `max_rate` or `budget` None (or 0) turns that limit off, as in the client.
    """
    if every < 1 or cost <= 0 or (max_rate is not None and max_rate < 0) or (budget is not None and budget < 0):
        raise ValueError("every must be >= 1, cost > 0, max_rate and budget >= 0 (or None)")
    min_interval = 1.0 / max_rate if max_rate else 0.0
    cost_ns = _ns(cost)
    estimate = 0  # the client's estimate of a sample's cost: none until the second sample
    samples = 0
    credit = 0
    since = every  # the first step is due
    last: Optional[Tuple[int, float]] = None  # the last decision's (step, ts)
    prev_step: Optional[int] = None
    per_step_s = 0.0  # the last decision's gap, per step
    next_decision = 0  # the first step the client looks at again
    last_sample_ts = float("-inf")
    keep: List[bool] = []
    for step, ts in points:
        if prev_step is not None and (step <= prev_step or (last is not None and ts < last[1])):
            raise ValueError("steps must increase and times must not go back (step %d at %.3f after step %d)" % (step, ts, prev_step))
        prev_step = step
        if step < next_decision:
            keep.append(False)
            continue
        if last is not None:
            n = step - last[0]
            since += n
            per_step_s = (ts - last[1]) / n
            if budget:
                per_step = min(per_step_s, STEP_CAP_S)
                # Each step's credit is capped at one sample's estimated cost; credit only grows
                # between samples, so capping the sum over the gap equals capping step by step.
                credit = min(estimate, credit + n * _ns(budget * SAMPLE_SHARE * per_step))
        last = (step, ts)
        paid = not budget or credit >= estimate
        # The budget holds no sample back more than MAX_GAP_S; such a sample leaves at most one
        # sample's debt.
        overdue = not paid and ts - last_sample_ts >= MAX_GAP_S
        due = since >= every and ts - last_sample_ts >= min_interval and (paid or overdue)
        keep.append(due)
        if due:
            since = 0
            last_sample_ts = ts
            samples += 1
            # The first sample also connects and sends the hello: it is charged, but the client
            # estimates the cost from the second on (a constant cost keeps its average at it).
            if samples >= 2:
                estimate = cost_ns
            if budget:
                credit -= cost_ns
                if overdue:
                    credit = max(credit, -estimate)  # at most one sample's debt
        # The steps skipped before the next decision (the client's Cadence._predict_wait).
        wait = every - since - 1
        if per_step_s > 0:
            ahead = (min_interval - (ts - last_sample_ts)) / per_step_s if min_interval else 0.0
            if budget:
                owed = (estimate - credit) / _ns(budget * SAMPLE_SHARE * min(per_step_s, STEP_CAP_S))
                ahead = min(max(ahead, owed), (MAX_GAP_S - (ts - last_sample_ts)) / per_step_s)
            wait = max(wait, int(ahead * WAIT_SHARE) if ahead >= 2 else 0)
        next_decision = step + 1 + wait
    return keep


PEAK = "allocated_bytes.all.peak"


def thin(lines: Sequence[str], **rule: Any) -> List[str]:
    """The trace's lines as the adaptive client would have sent them.

    Train samples the rule skips are dropped; the next sample sent (train or eval) carries the
    highest peak since the last one sent. Everything else (hello, events, eval samples, bye) is
    kept byte for byte.
    """
    msgs: List[Optional[Dict[str, Any]]] = []
    points: List[Tuple[int, float]] = []
    for line in lines:
        m = json.loads(line) if '"type":"sample"' in line else None
        if m is not None and m.get("type") != "sample":
            m = None
        msgs.append(m)
        if m is not None and m["phase"] == "train":
            points.append((m["step"], m["ts"]))
    keep = iter(adaptive_keep(points, **rule))
    out: List[str] = []
    carried = 0
    for line, m in zip(lines, msgs):
        if m is None:
            out.append(line)
            continue
        peak = m["stats"].get(PEAK, 0)
        if m["phase"] == "train" and not next(keep):
            carried = max(carried, peak)
            continue
        if carried > peak:
            m["stats"][PEAK] = carried
            line = json.dumps(m, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        carried = 0
        out.append(line)
    return out
