import pytest

from gpumon_client.cadence import Cadence


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def run(cadence, clock, steps, step_time, sample_cost):
    """Drives `steps` training steps; returns the sampled step numbers and the client's total cost."""
    sampled, spent = [], 0.0
    for step in range(1, steps + 1):
        clock.t += step_time
        if cadence.due():
            clock.t += sample_cost
            cadence.spent(sample_cost)
            sampled.append(step)
            spent += sample_cost
    return sampled, spent


@pytest.mark.parametrize("max_rate", [10.0, None])
@pytest.mark.parametrize("step_time", [0.0004, 0.005, 0.05, 1.0])
def test_cost_stays_within_budget_for_any_step_length(step_time, max_rate):
    clock = Clock()
    cadence = Cadence(max_rate=max_rate, clock=clock)
    steps = 20000 if step_time < 0.01 else 2000
    sampled, spent = run(cadence, clock, steps, step_time, sample_cost=200e-6)
    assert sampled[0] == 1
    per_step = spent / steps
    # 0.5 % of the step and 25 us per step, amortised (one sample of slack for the free first one).
    assert per_step <= min(0.005 * step_time, 25e-6) + 200e-6 / steps
    if max_rate is None:
        assert per_step >= 0.5 * min(0.005 * step_time, 25e-6)  # the budget is used, not wasted


def test_rate_limit_caps_fast_cheap_steps():
    clock = Clock()
    cadence = Cadence(max_rate=10.0, clock=clock)
    sampled, _ = run(cadence, clock, 10000, 0.001, sample_cost=1e-6)  # 10 s of 1 ms steps
    assert 95 <= len(sampled) <= 101
    gaps = [b - a for a, b in zip(sampled, sampled[1:])]
    assert min(gaps) >= 99  # 100 steps = 0.1 s apart


def test_limits_off_samples_every_step_and_every_n():
    clock = Clock()
    assert run(Cadence(max_rate=None, budget=None, clock=clock), clock, 7, 0.0001, 1e-3)[0] == list(range(1, 8))
    assert run(Cadence(every=3, max_rate=0, budget=0, clock=clock), clock, 10, 0.0001, 1e-3)[0] == [1, 4, 7, 10]


def test_a_long_pause_does_not_buy_a_burst():
    clock = Clock()
    cadence = Cadence(max_rate=None, clock=clock)
    run(cadence, clock, 100, 0.0004, 200e-6)
    clock.t += 600.0  # ten minutes of evaluation without optimizer steps
    sampled, _ = run(cadence, clock, 100, 0.0004, 200e-6)
    assert len(sampled) <= 2


def test_cost_estimate_follows_a_cheaper_source():
    clock = Clock()
    cadence = Cadence(max_rate=None, clock=clock)
    slow, _ = run(cadence, clock, 5000, 0.001, 500e-6)
    fast, _ = run(cadence, clock, 5000, 0.001, 50e-6)
    assert len(fast) > 5 * len(slow)


@pytest.mark.parametrize("kwargs, word", [
    ({"every": 0}, "every=0"),
    ({"max_rate": -1}, "max_rate=-1"),
    ({"budget": 1.5}, "budget=1.5"),
    ({"budget": float("nan")}, "budget=nan"),
])
def test_bad_settings_name_the_value(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Cadence(**kwargs)
