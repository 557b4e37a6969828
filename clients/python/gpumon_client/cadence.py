"""When to sample: a per-step decision that keeps the client's cost a bounded share of the step.

A sample costs what `torch.cuda.memory_stats()` costs (about 180 us on an H100) plus building and
sending one line; a fast training step can be shorter than that. So the client earns a budget per
step, `budget * min(step time, 5 ms)` (0.5 % of the step, at most 25 us with the default), spends
the measured cost of each sample from it, and samples only when the budget covers one more. On top
of that, at most `max_rate` samples per second (the daemon needs a trend, not every step) and at
least `every` steps apart. The first step is always sampled, so a session shows up at once.

Steps that are not sampled cost one `perf_counter()` call and a few comparisons.
"""

import time
from typing import Callable, Optional

# Step time beyond which the budget stops growing: keeps slow steps at <= budget * 5 ms each.
_STEP_CAP = 0.005
# How fast the cost estimate follows new measurements (one slow sample should not stall sampling).
_EWMA = 0.2


class Cadence:
    """Decides, once per training step, whether this step is sampled.

    every: at least this many steps between samples (1: any step may be sampled).
    max_rate: at most this many samples per second; None or 0: no limit.
    budget: share of step time the client may spend; None or 0: no limit.
    """

    def __init__(
        self,
        every: int = 1,
        max_rate: Optional[float] = 10.0,
        budget: Optional[float] = 0.005,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if int(every) < 1:
            raise ValueError("gpumon: every=%r: must be 1 or more (steps between samples)" % (every,))
        if max_rate is not None and not float(max_rate) >= 0:
            raise ValueError("gpumon: max_rate=%r: must be a positive number of samples per second, or None" % (max_rate,))
        if budget is not None and not 0 <= float(budget) < 1:
            raise ValueError("gpumon: budget=%r: must be a share of step time in [0, 1), or None" % (budget,))
        self.every = int(every)
        self.min_interval = 1.0 / float(max_rate) if max_rate else 0.0
        self.budget = float(budget) if budget else 0.0
        self._clock = clock
        self.cost = 0.0  # estimated seconds per sample; 0 until the first one is measured
        self.credit = 0.0  # seconds the client may still spend
        self._since = self.every  # steps since the last sample: the first step is due
        self._last_step: Optional[float] = None
        self._last_sample = -float("inf")
        self._samples = 0

    def due(self) -> bool:
        """Called at each step; True when this step should be sampled (then call `spent`)."""
        now = self._clock()
        last, self._last_step = self._last_step, now
        self._since += 1
        if self.budget and last is not None:
            dt = now - last
            credit = self.credit + self.budget * (dt if dt < _STEP_CAP else _STEP_CAP)
            # Capped at one sample's worth, so a long pause (evaluation) does not buy a burst.
            self.credit = credit if credit < self.cost else self.cost
        if self._since < self.every:
            return False
        if now - self._last_sample < self.min_interval:
            return False
        return not self.budget or self.credit >= self.cost

    def spent(self, seconds: float) -> None:
        """Records that a sample was taken at this step and what it cost."""
        self._since = 0
        self._last_sample = self._last_step if self._last_step is not None else self._clock()
        seconds = max(0.0, float(seconds))
        self._samples += 1
        if self._samples == 1:
            pass  # the first sample also connects and builds the hello: charged, but no estimate
        elif self.cost == 0.0:
            self.cost = seconds
        else:
            # One preempted or stalled sample moves the estimate at most 4x its current value.
            capped = seconds if seconds < 4 * self.cost else 4 * self.cost
            self.cost += _EWMA * (capped - self.cost)
        if self.budget:
            self.credit -= seconds
