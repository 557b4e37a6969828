"""When to sample: a per-step decision that keeps the client's cost a bounded share of the step.

A sample costs what `torch.cuda.memory_stats()` costs (70.5 us on an H100, torch 2.11) plus building and
sending one line; a fast training step can be shorter than that. So the client has a budget per
step, `budget * min(step time, 5 ms)` (0.5 % of the step, at most 25 us with the default), for its
whole cost. Samples earn 3/5 of it as credit (the rest pays for the step hook and what a sample
costs the steps after it, which the cadence does not time), spend the measured cost of each
sample from that credit, and sample only when the credit covers one more. On top
of that, at most `max_rate` samples per second (the daemon needs a trend, not every step) and at
least `every` steps apart. The first step is always sampled, so a session shows up at once; and
the budget never holds a sample back past the first step `_MAX_GAP` (5 minutes) after the last,
so a trainer with minute-long steps stays inside the daemon's idle timeout.

Most steps do not read the clock at all. After each decision the cadence predicts, from the last
step time, how many steps must pass before the next sample can be due (by `every` exactly, by the
rate limit and the budget at the current step time) and sets `wait` to 7/8 of that: the caller
skips that many steps without asking (`tick` counts them down, as attach()'s hook does)
and the next decision credits the skipped steps at their average time. On steady steps the
sample falls on the same step as a decision at every step would take; when steps slow down by
more than 8/7 it comes at most `wait` steps late. Reading the clock at every step cost more than
everything else the step path does (about 1.2 us of a 0.36 ms CPU step, measured in the training
loop, where the step has evicted the caches), so the cadence decides three or four times per sample
instead. A decision costs about 14 us in the loop of a 0.5 ms CPU step (the whole step path, its
objects out of the cache), so 7/8 rather than half: half took 8 decisions per sample at that step,
7/8 takes 3-4, and the client's whole cost there fell by 0.6 us a step (docs/performance.md).

`Throttle` keeps any caller's samples under the daemon's line rate limit (the welcome's
`max_lines_per_second`): at most `_LIMIT_SHARE` of it, and half that for a while after each
`rate_limited` notice, since the daemon drops the lines over its limit.
"""

import time
from typing import Any, Callable, Optional

# Step time beyond which the budget stops growing: keeps slow steps at <= budget * 5 ms each.
_STEP_CAP = 0.005
# How fast the cost estimate follows new measurements (one slow sample should not stall sampling).
_EWMA = 0.2
# Share of the daemon's line limit samples may use: room for events, marks and jitter.
_LIMIT_SHARE = 0.8
# Seconds a `rate_limited` notice halves the rate for (each further notice halves it again).
_SLOW_FOR = 10.0
# The lowest the notices can push the rate: 1/64 of the share.
_MIN_FACTOR = 1.0 / 64
# The share of the steps the rate limit and the budget predict that a decision skips: a sample
# stays on time while steps slow down by up to 8/7 before it.
_WAIT_SHARE = 0.875
# The share of the budget samples may spend. The cadence times only the samples; the rest pays for
# what it cannot time: the step hook at every step (a few us) and what a sample costs the steps
# after it (the caches it took). Spending it all on samples put the client's whole cost over its
# budget wherever the budget binds (steps of 5 ms and more: docs/performance.md).
_SAMPLE_SHARE = 0.6
# The most the first sample is charged. It also connects and sends the hello (about 1 ms on a CPU,
# more on a GPU's first memory_stats), once a session; charged in full, at steps of 30 s it held
# the second sample back longer than the daemon's idle timeout (15 minutes).
_FIRST_CHARGE = 250e-6
# The longest the budget may hold a sample back, in seconds: a third of the daemon's default idle
# timeout (900 s), which closes a session that sends nothing. At steps of a minute the budget
# alone spaced samples 10-20 steps apart. Such a sample is charged, but leaves at most one
# sample's debt, so minute-long steps do not pile up a debt that would stall faster steps after.
_MAX_GAP = 300.0


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
        self._earn = self.budget * _SAMPLE_SHARE  # the share of step time samples may spend
        self._clock = clock
        self.cost = 0.0  # estimated seconds per sample; 0 until the first one is measured
        self.credit = 0.0  # seconds the client may still spend
        self._since = self.every  # steps since the last sample: the first step is due
        self._last_step: Optional[float] = None
        self._last_sample = -float("inf")
        self._samples = 0
        self._dt = 0.0  # seconds per step over the last decision's gap; 0 until two decisions
        # Steps after the last decision that cannot be due, or are not worth a clock read: the
        # caller may skip them (`tick` does), and passes how many it skipped to `due`.
        self.wait = 0
        self._skipped = 0
        self._overdue = False  # the sample due now is due by _MAX_GAP alone

    def tick(self) -> bool:
        """Called at every step: True when this step should be sampled (then call `spent`). A step
        inside `wait` costs a decrement; the others a decision (`due`)."""
        if self.wait:
            self.wait -= 1
            self._skipped += 1
            return False
        steps, self._skipped = self._skipped + 1, 0
        return self.due(steps)

    def due(self, steps: int = 1) -> bool:
        """A decision at a step: True when it should be sampled (then call `spent`). `steps`: the
        steps since the last decision, this one included (more than 1 when the caller skipped
        `wait` steps); they earn credit at their average time."""
        now = self._clock()
        last, self._last_step = self._last_step, now
        self._since += steps
        if last is not None:
            dt = (now - last) / steps
            self._dt = dt
            if self._earn:
                credit = self.credit + steps * self._earn * (dt if dt < _STEP_CAP else _STEP_CAP)
                # Capped at one sample's worth, so a long pause (evaluation) does not buy a burst.
                self.credit = credit if credit < self.cost else self.cost
        gap = now - self._last_sample
        if self._since >= self.every and gap >= self.min_interval:
            if not self.budget or self.credit >= self.cost:
                self.wait = 0
                self._overdue = False
                return True
            if gap >= _MAX_GAP:
                self.wait = 0
                self._overdue = True
                return True
        self.wait = self._predict_wait(now)
        return False

    def spent(self, seconds: float) -> None:
        """Records that a sample was taken at this step and what it cost."""
        self._since = 0
        self._last_sample = self._last_step if self._last_step is not None else self._clock()
        seconds = max(0.0, float(seconds))
        self._samples += 1
        if self._samples == 1:
            # The first sample also connects and sends the hello, once a session: charged as a
            # sample at most, and no estimate.
            seconds = seconds if seconds < _FIRST_CHARGE else _FIRST_CHARGE
        elif self.cost == 0.0:
            self.cost = seconds
        else:
            # One preempted or stalled sample moves the estimate at most 4x its current value.
            capped = seconds if seconds < 4 * self.cost else 4 * self.cost
            self.cost += _EWMA * (capped - self.cost)
        if self.budget:
            credit = self.credit - seconds
            # A sample the budget did not pay for (_MAX_GAP) leaves at most one sample's debt.
            self.credit = credit if not self._overdue or credit > -self.cost else -self.cost
        self._overdue = False
        self.wait = self._predict_wait(self._last_sample)

    def _predict_wait(self, now: float) -> int:
        # `every` is counted in steps: those steps cannot be due whatever their length. The rate
        # limit and the budget depend on step time, which can change: 7/8 of the prediction.
        exact = self.every - self._since - 1
        dt = self._dt
        steps = 0.0
        if dt > 0:
            if self.min_interval:
                steps = (self.min_interval - (now - self._last_sample)) / dt
            if self._earn:
                per_step = self._earn * (dt if dt < _STEP_CAP else _STEP_CAP)
                owed = (self.cost - self.credit) / per_step
                steps = owed if owed > steps else steps
                overdue = (_MAX_GAP - (now - self._last_sample)) / dt
                steps = overdue if overdue < steps else steps
        most = int(steps * _WAIT_SHARE) if steps >= 2 else 0
        return exact if exact > most else most


class Throttle:
    """Paces samples under the daemon's line rate limit with a token bucket: a steady rate of a
    share of the limit and a burst of one second of it (the daemon allows bursts of twice its
    limit), so a few fast steps in a row all go. No limit known (an older daemon, or no welcome
    yet): every sample goes. `skipped` counts the samples it held back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.limit: Optional[float] = None  # lines per second, from the welcome
        self.rate = 0.0  # samples a second allowed now; 0: no pacing
        self.factor = 1.0  # < 1 for _SLOW_FOR seconds after a rate_limited notice
        self._slow_until = 0.0
        self._tokens = 0.0
        self._last: Optional[float] = None
        self.skipped = 0

    def set_limit(self, limit: Any) -> None:
        """The welcome's max_lines_per_second (anything but a positive number: no limit)."""
        ok = isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0
        self.limit = float(limit) if ok else None
        self._pace()
        self._tokens = self.rate  # a new connection starts with a full burst

    def limited(self) -> None:
        """The daemon said `rate_limited`: it dropped lines. Halve the rate for a while."""
        self.factor = max(self.factor / 2, _MIN_FACTOR)
        self._slow_until = self._clock() + _SLOW_FOR
        self._pace()
        self._tokens = min(self._tokens, self.rate)

    def allow(self) -> bool:
        """True when a sample may go now (and it is counted as gone)."""
        if not self.rate:
            return True
        now = self._clock()
        if self.factor < 1.0 and now >= self._slow_until:
            self.factor = 1.0
            self._pace()
        if self._last is not None:
            self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1.0:
            self.skipped += 1
            return False
        self._tokens -= 1.0
        return True

    def _pace(self) -> None:
        # Without a known limit there is no rate to halve: a notice then waits for a welcome
        # that names one (an older daemon names none, and closes instead).
        limit = self.limit
        self.rate = limit * _LIMIT_SHARE * self.factor if limit else 0.0
