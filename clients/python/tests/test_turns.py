"""The benches' turn-taking (bench/turns.py, which does not ship): each arm's clock runs only in
its turns, each arm's hook is registered only for its turns, and the arms' order changes from
turn to turn."""

import os
import random
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

from turns import ArmClock, on_own_clock, take_turns  # noqa: E402


class FakeTime:
    """A clock that moves only when the test says: what the tests check is then exact, whatever
    the machine's load (a 20 ms sleep took 60 ms on a busy CI machine)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_an_arm_clock_runs_only_between_run_and_pause():
    now = FakeTime()
    clock = ArmClock(now)
    assert clock() == 0.0
    now.sleep(0.02)
    assert clock() == 0.0  # not running: stands still
    clock.run()
    now.sleep(0.02)
    assert clock() == pytest.approx(0.02)
    clock.pause()
    paused = clock()
    now.sleep(0.03)
    assert clock() == paused == pytest.approx(0.02)  # the 30 ms paused are not counted
    clock.pause()  # a second pause changes nothing
    assert clock() == paused
    clock.run()
    now.sleep(0.01)
    assert clock() == pytest.approx(paused + 0.01)


def test_an_arm_clock_reads_the_wall_clock_by_default():
    clock = ArmClock()
    clock.run()
    time.sleep(0.001)
    assert clock() >= 0.001


class Registry:
    """A stand-in for torch's global step hooks: what is registered while a step runs."""

    def __init__(self):
        self.hooks = {}
        self.next = 0

    def register(self, hook):
        key = self.next
        self.next += 1
        self.hooks[key] = hook
        registry = self

        class Handle:
            def remove(self):
                del registry.hooks[key]

        return Handle()


def test_each_arm_steps_alone_with_its_own_hook_and_clock():
    registry = Registry()
    now = FakeTime()
    clocks = {"a": ArmClock(now), "b": ArmClock(now)}
    seen = []  # per step: which hooks were registered, and which clocks ran

    def hook_a(opt, args, kwargs):
        pass

    def hook_b(opt, args, kwargs):
        pass

    def step():
        running = tuple(name for name, c in clocks.items() if c.started is not None)
        seen.append((tuple(sorted(h.__name__ for h in registry.hooks.values())), running))
        now.sleep(0.0005)

    arms = {"bare": (None, None), "a": (hook_a, clocks["a"]), "b": (hook_b, clocks["b"])}
    writes = [0]

    def settle():
        writes[0] += 1  # stands in for what a turn's end flushes: counted to the turn's arm

    t = take_turns(
        step, arms, 3, 20, random.Random(1), registry.register, settle=settle, count=lambda: writes[0], now=now
    )
    assert registry.hooks == {}  # every handle removed
    assert len(seen) == 3 * 3 * 20
    assert set(seen) == {((), ()), (("hook_a",), ("a",)), (("hook_b",), ("b",))}
    # Steps come in turns of 3 with one arm's state throughout.
    for i in range(0, len(seen), 3):
        assert seen[i] == seen[i + 1] == seen[i + 2]
    # Each arm's totals: 20 turns of 3 steps of 0.5 ms, its clock exactly as long as its turns.
    for name in arms:
        wall, cpu, counted = t[name]
        assert wall == pytest.approx(20 * 3 * 0.0005)
        assert cpu >= 0
        assert counted == 20
    for name in ("a", "b"):
        assert clocks[name]() == pytest.approx(t[name][0], rel=1e-9)
    # The order changes from turn to turn.
    orders = {tuple(seen[i][0] for i in range(j, j + 9, 3)) for j in range(0, len(seen), 9)}
    assert len(orders) > 1


def test_bad_turns_are_refused():
    with pytest.raises(ValueError, match="steps_per_turn=0"):
        take_turns(lambda: None, {"bare": (None, None)}, 0, 1, random.Random(1), Registry().register)
    with pytest.raises(ValueError, match="turns=0"):
        take_turns(lambda: None, {"bare": (None, None)}, 1, 0, random.Random(1), Registry().register)


def test_on_own_clock_gives_the_cadence_and_the_write_schedule_the_arms_clock():
    from gpumon_client.client import Client
    from gpumon_client.hooks import Attachment
    from gpumon_client.stats import StaticStatsSource

    client = Client("turns", source=StaticStatsSource(), socket="/nonexistent/gpumon.sock")
    try:
        att = Attachment(client)
        clock = on_own_clock(att, every=3, max_rate=None)
        assert att.cadence.every == 3 and att.cadence.min_interval == 0.0
        assert att.cadence._clock is clock and client.transport._monotonic is clock
        time.sleep(0.01)
        assert clock() == 0.0  # stands still until its arm's turn
    finally:
        client.close(timeout=0)
    assert on_own_clock(Attachment()) is not None  # a no-op attachment: no client to touch
