"""The benches' turn-taking (gpumon_client.turns): each arm's clock runs only in its turns, each
arm's hook is registered only for its turns, and the arms' order changes from turn to turn."""

import random
import time

import pytest

from gpumon_client.turns import ArmClock, on_own_clock, take_turns


def test_an_arm_clock_runs_only_between_run_and_pause():
    clock = ArmClock()
    assert clock() == 0.0
    time.sleep(0.02)
    assert clock() == 0.0  # not running: stands still
    clock.run()
    time.sleep(0.02)
    running = clock()
    assert running >= 0.02
    clock.pause()
    paused = clock()
    time.sleep(0.03)
    assert clock() == paused < 0.05  # the 30 ms paused are not counted
    clock.pause()  # a second pause changes nothing
    assert clock() == paused
    clock.run()
    time.sleep(0.01)
    assert clock() >= paused + 0.01


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
    clocks = {"a": ArmClock(), "b": ArmClock()}
    seen = []  # per step: which hooks were registered, and which clocks ran

    def hook_a(opt, args, kwargs):
        pass

    def hook_b(opt, args, kwargs):
        pass

    def step():
        running = tuple(name for name, c in clocks.items() if c.started is not None)
        seen.append((tuple(sorted(h.__name__ for h in registry.hooks.values())), running))
        time.sleep(0.0005)

    arms = {"bare": (None, None), "a": (hook_a, clocks["a"]), "b": (hook_b, clocks["b"])}
    writes = [0]

    def settle():
        writes[0] += 1  # stands in for what a turn's end flushes: counted to the turn's arm

    t = take_turns(step, arms, 3, 20, random.Random(1), registry.register, settle=settle, count=lambda: writes[0])
    assert registry.hooks == {}  # every handle removed
    assert len(seen) == 3 * 3 * 20
    assert set(seen) == {((), ()), (("hook_a",), ("a",)), (("hook_b",), ("b",))}
    # Steps come in turns of 3 with one arm's state throughout.
    for i in range(0, len(seen), 3):
        assert seen[i] == seen[i + 1] == seen[i + 2]
    # Each arm's totals: 20 turns of 3 steps of at least 0.5 ms, its clock as long as its turns.
    for name in arms:
        wall, cpu, counted = t[name]
        assert wall >= 20 * 3 * 0.0005
        assert 0 <= cpu <= wall
        assert counted == 20
    for name in ("a", "b"):
        assert clocks[name]() == pytest.approx(t[name][0], rel=0.05)
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
