import pytest

from gpumon_client.cadence import Cadence


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class CountingClock(Clock):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.t


def run(cadence, clock, steps, step_time, sample_cost, decide=None):
    """Drives `steps` training steps through `tick` (or `decide`); returns the sampled step
    numbers and the client's total cost."""
    decide = decide or cadence.tick
    sampled, spent = [], 0.0
    for step in range(1, steps + 1):
        clock.t += step_time
        if decide():
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
    # Samples get 3/5 of the budget (0.5 % of the step and 25 us per step, amortised): the rest is
    # the step hook's and what a sample costs the steps after it (one sample of slack for the free
    # first one).
    assert per_step <= 0.6 * min(0.005 * step_time, 25e-6) + 200e-6 / steps
    if max_rate is None:
        assert per_step >= 0.45 * min(0.005 * step_time, 25e-6)  # their share is used, not wasted


def sample_slow_steps(cadence, clock, steps, step_time, first_cost=3e-3, cost=150e-6):
    """Steps of `step_time`; the first sample connects and sends the hello (`first_cost`)."""
    sampled = []
    for step in range(1, steps + 1):
        clock.t += step_time
        if cadence.tick():
            spent = first_cost if not sampled else cost
            clock.t += spent
            cadence.spent(spent)
            sampled.append(step)
    return sampled


def test_the_first_samples_connect_does_not_hold_the_next_back():
    # 2 s steps, 15 us of credit a step. Charged in full, the first sample's 3 ms would hold the
    # second back 200 steps (at 20 s steps, 67 minutes: past the daemon's 15-minute idle
    # timeout); charged as a sample (250 us at most), 17.
    clock = Clock()
    sampled = sample_slow_steps(Cadence(clock=clock), clock, 60, 2.0)
    assert sampled[:2] == [1, 18], sampled
    # From the second on, the measured cost: a sample every 10 steps (150 us of 15 us a step).
    assert sampled[2:5] == [38, 48, 58], sampled


def test_no_gap_between_samples_outlasts_five_minutes():
    # Minute-long steps: the budget alone spaces samples 10-20 steps (minutes) apart, and the
    # daemon closes a session silent for 15 minutes. A sample comes at least every 5 minutes.
    clock = Clock()
    cadence = Cadence(clock=clock)
    sampled = sample_slow_steps(cadence, clock, 100, 60.0)
    assert sampled[:4] == [1, 6, 11, 16], sampled
    assert max(b - a for a, b in zip(sampled, sampled[1:])) * 60.0 <= 300.0
    # They are charged, but leave at most one sample's debt: when the steps speed up, the budget
    # pays it back within 20 steps and samples every 10 again.
    assert cadence.credit >= -cadence.cost
    faster = sample_slow_steps(cadence, clock, 40, 1.0, first_cost=150e-6)
    assert faster[0] <= 21 and [b - a for a, b in zip(faster, faster[1:])] == [10] * (len(faster) - 1), faster


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


@pytest.mark.parametrize("max_rate", [10.0, None])
@pytest.mark.parametrize("step_time", [0.0002, 0.0004, 0.003, 0.05])
def test_skipping_steps_samples_the_same_steps_on_steady_steps(step_time, max_rate):
    # Steady steps: skipping 7/8 never overshoots, so the steps sampled are the ones a decision at
    # every step takes, and the clock is read a few times per sample rather than at every step.
    # (A sample cost that is no whole number of steps' credit: no float ties at the boundary.)
    every_step = CountingClock()
    a = Cadence(max_rate=max_rate, clock=every_step)
    want, _ = run(a, every_step, 5000, step_time, 97e-6, decide=a.due)
    skipping = CountingClock()
    b = Cadence(max_rate=max_rate, clock=skipping)
    got, _ = run(b, skipping, 5000, step_time, 97e-6)
    assert got == want
    if step_time < 0.001:
        # Each decision skips 7/8 of the steps left: 3-4 reads per sample here (half took 8)
        assert skipping.reads <= 5 * len(got), (skipping.reads, len(got))
        assert skipping.reads * 5 < every_step.reads, (skipping.reads, every_step.reads)


def test_a_slowdown_delays_a_sample_by_at_most_the_steps_skipped():
    clock = Clock()
    cadence = Cadence(clock=clock)
    run(cadence, clock, 1000, 0.0004, 97e-6)  # 0.4 s of fast steps
    while True:
        clock.t += 0.0004
        if cadence.tick():
            cadence.spent(97e-6)
            break
    wait = cadence.wait
    assert 210 < wait < 225  # the rate limit is 250 steps away: 7/8 of them are skipped
    # Steps now take 20 ms: by the rate limit alone the fifth is due (0.1 s); the sample waits
    # for the skipped steps, and no longer.
    taken = None
    for step in range(1, wait + 10):
        clock.t += 0.02
        if cadence.tick():
            taken = step
            break
    assert taken == wait + 1


def test_the_step_hook_counts_steps_and_keeps_no_optimizer_alive():
    import gc
    import weakref

    from gpumon_client.hooks import Attachment

    class Optimizer:
        pass

    state = Attachment(None, Cadence())  # no client: the hook only counts
    opt = Optimizer()
    for _ in range(1000):  # more than one countdown (at most 250 steps each)
        state.hook(opt, (), {})
    assert state.step == 1000
    gone = weakref.ref(opt)
    del opt
    gc.collect()
    assert gone() is None  # the hook's reference is weak: a dropped optimizer (and its state) is freed
