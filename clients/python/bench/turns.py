"""Measuring what the client costs a training step: arms that take turns every few steps.

The client's whole cost at a short step is a few microseconds, and a shared machine's speed
drifts at every time scale: on a 2-core VM the mean step moved by a tenth between blocks of 10 ms
as much as between blocks of 0.3 s, so bare and attached blocks of 0.3 s each compared two
different machines. Arms that take turns every few steps, in a new random order at every turn,
see the same machine. `bench/bench_client.py` and gpu-check's `bench_overhead.py` measure so.
A bench module: it does not ship with the client (tests/test_turns.py checks it).

An attached arm must still be sampled as a trainer running only that arm would be: its cadence
and write schedule read an `ArmClock`, which runs only during the arm's own turns (the wall
clock would give the arm samples at about twice a trainer's rate per step).
"""

import random
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from gpumon_client.cadence import Cadence

if TYPE_CHECKING:
    from gpumon_client.hooks import Attachment


class ArmClock:
    """A clock (seconds, like `time.perf_counter`) that runs only between `run` and `pause`."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.base = 0.0
        self.started: Optional[float] = None
        self.now = now  # a test's own clock, so that what it checks does not depend on load

    def __call__(self) -> float:
        started = self.started
        return self.base if started is None else self.base + self.now() - started

    def run(self) -> None:
        self.started = self.now()

    def pause(self) -> None:
        if self.started is not None:
            self.base += self.now() - self.started
            self.started = None


def on_own_clock(att: "Attachment", **cadence: Any) -> ArmClock:
    """Gives an attachment a cadence (`Cadence`'s arguments) and a write schedule that read a clock
    of their own, and returns that clock: the arm's, to run only during its turns."""
    clock = ArmClock()
    att.cadence = Cadence(clock=clock, **cadence)
    if att.client is not None:
        att.client.transport._monotonic = clock  # the write schedule's clock (private: ours)
    return clock


# An arm: the step post-hook it registers during its turns (None: bare) and the clock that runs
# during them (None: nothing reads one).
Arm = Tuple[Optional[Callable[[Any, Any, Any], None]], Optional[ArmClock]]


def take_turns(
    step: Callable[[], None],
    arms: Dict[str, Arm],
    steps_per_turn: int,
    turns: int,
    rng: random.Random,
    register: Callable[[Callable[[Any, Any, Any], None]], Any],
    settle: Optional[Callable[[], None]] = None,
    count: Optional[Callable[[], int]] = None,
    now: Callable[[], float] = time.perf_counter,
) -> Dict[str, Tuple[float, float, int]]:
    """Runs `turns` turns of every arm, `steps_per_turn` steps each, the arms in a new random
    order at every turn. An arm's hook is registered (`register` returns a handle with
    `remove()`) only for its turns, outside the timing. `settle` runs at the end of each turn,
    inside its timing (a CUDA synchronize: the turn's work done). `count` is read before and
    after each turn, outside the timing (a transport's writes). Returns each arm's sums over its
    turns: (wall seconds, this thread's CPU seconds, what `count` rose by). `now` is the wall
    clock (a test's own, so that its checks do not depend on the machine's load)."""
    if steps_per_turn < 1 or turns < 1:
        raise ValueError("take_turns: steps_per_turn=%r, turns=%r: both must be 1 or more" % (steps_per_turn, turns))
    names = list(arms)
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    counted = dict.fromkeys(names, 0)
    wall_clock, cpu_clock = now, time.thread_time
    for _ in range(turns):
        rng.shuffle(names)
        for name in names:
            hook, clock = arms[name]
            handle = register(hook) if hook is not None else None
            before = count() if count is not None else 0
            if clock is not None:
                clock.run()
            c0, t0 = cpu_clock(), wall_clock()
            for _ in range(steps_per_turn):
                step()
            if settle is not None:
                settle()
            t1, c1 = wall_clock(), cpu_clock()
            if clock is not None:
                clock.pause()
            if handle is not None:
                handle.remove()
            if count is not None:
                counted[name] += count() - before
            wall[name] += t1 - t0
            cpu[name] += c1 - c0
    return {name: (wall[name], cpu[name], counted[name]) for name in arms}
