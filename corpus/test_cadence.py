"""Tests of the adaptive cadence rule (cadence.py) the corpus replays."""

import json
import os
import sys
from typing import Any, Dict, List, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cadence import SAMPLE_COST_S, adaptive_keep, thin  # noqa: E402

CLIENT = os.path.join(HERE, "..", "clients", "python")


def steps(dt: float, n: int, t0: float = 1024.0) -> List[Tuple[int, float]]:
    """n steps of dt seconds each: (step, end time). Tests use step times that are exact in binary,
    so a 0.1 s boundary falls where the arithmetic says (the client compares floats too)."""
    return [(i, t0 + i * dt) for i in range(1, n + 1)]


def kept(points: List[Tuple[int, float]], **rule: Any) -> List[int]:
    return [s for (s, _), k in zip(points, adaptive_keep(points, **rule)) if k]


def test_slow_steps_are_sampled_every_8_steps() -> None:
    # 15 us of credit per step (3/5 of 0.5% of the 5 ms cap), 120 us per sample. The first is
    # paid back by step 9; from the second on the credit must also cover the next sample's
    # estimated cost, so the third comes 16 steps later. 8 steps of 15.6 ms are over 0.1 s.
    for dt in (1.0, 0.25, 2**-6):
        assert kept(steps(dt, 60)) == [1, 9, 25, 33, 41, 49, 57], dt


def test_fast_steps_are_limited_by_the_rate() -> None:
    # ~1 ms steps (2**-10 s): the budget allows a sample every 41 steps (2.930 us of credit per
    # step), max_rate 10/s one every 103 steps (0.1 s / 2**-10 s = 102.4): the rate binds.
    assert kept(steps(2**-10, 1000)) == [1, 104, 207, 310, 413, 516, 619, 722, 825, 928]
    # Without the rate limit the budget binds: 41 steps to pay back a sample (42), 82 to pay back
    # one and cover the next (124), then 41 each.
    assert kept(steps(2**-10, 200), max_rate=None) == [1, 42, 124, 165]
    # ~4 ms steps (2**-8 s): the budget allows one every 11 steps, the rate one every 26.
    assert kept(steps(2**-8, 100)) == [1, 27, 53, 79]
    assert kept(steps(2**-8, 100), max_rate=None) == [1, 12, 33, 44, 55, 66, 77, 88, 99]


def test_limits_off_sample_every_step_and_every_counts_steps() -> None:
    pts = steps(0.0001, 30)
    assert kept(pts, max_rate=None, budget=None) == list(range(1, 31))
    assert kept(pts, every=7, max_rate=0, budget=0) == [1, 8, 15, 22, 29]
    assert kept(steps(1.0, 60), every=12) == [1, 13, 29, 41, 53]


def test_a_pause_does_not_buy_a_burst() -> None:
    # An eval of 10 minutes between steps 20 and 21: credit is capped at one sample. The first
    # decision after it (step 24: the last one before skipped 21-23) finds no sample for over 5
    # minutes and samples; it leaves a sample's debt, so the pace goes on (8 steps), no burst.
    pts = steps(1.0, 20) + [(s, 2000.0 + s) for s in range(21, 60)]
    assert kept(pts) == [1, 9, 24, 33, 41, 49, 57]


def test_no_gap_outlasts_five_minutes() -> None:
    # Minute-long steps: the budget alone would space samples 8 steps (8 minutes) apart, and the
    # daemon closes a session silent for 15. One sample every 5 steps (300 s).
    assert kept(steps(60.0, 30)) == [1, 6, 11, 16, 21, 26]


def test_a_trace_sampled_every_n_steps_earns_credit_between_its_samples() -> None:
    # attach(every=4): the steps in between are not candidates, but they earn credit.
    pts = [(s, 100.0 + s) for s in range(4, 100, 4)]
    assert kept(pts) == [4, 12, 28, 36, 44, 52, 60, 68, 76, 84, 92]
    pts = [(s, 100.0 + s) for s in range(5, 100, 5)]
    assert kept(pts) == [5, 15, 35, 45, 55, 65, 75, 85, 95]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="steps must increase"):
        adaptive_keep([(5, 1.0), (5, 2.0)])
    with pytest.raises(ValueError, match="times must not go back"):
        adaptive_keep([(5, 2.0), (6, 1.0)])
    with pytest.raises(ValueError, match="every must be >= 1"):
        adaptive_keep([(1, 1.0)], every=0)


def test_the_rule_matches_the_clients_cadence() -> None:
    """The same decisions as the client's own Cadence class, driven by the same step times, with
    the steps it skips without a decision (`tick`, as its callbacks drive it)."""
    if not os.path.exists(os.path.join(CLIENT, "gpumon_client", "cadence.py")):
        pytest.skip("the client has no cadence module")
    sys.path.insert(0, CLIENT)
    try:
        from gpumon_client.cadence import Cadence
    finally:
        sys.path.remove(CLIENT)
    pattern = [0.7, 0.0004, 0.003, 0.012, 2.5, 0.0009, 0.006, 30.0, 0.2, 90.0, 0.00093]
    pts: List[Tuple[int, float]] = []
    t = 5000.0
    for i in range(1, 4001):
        t += pattern[(i // 97) % len(pattern)]  # runs of 97 steps at each speed
        pts.append((i, round(t, 6)))
    # A sample cost that is no whole number of steps' credit: the client's float credit and the
    # rule's integer one then never tie at the boundary.
    cost = SAMPLE_COST_S - 1e-6
    now = [0.0]
    client = Cadence(clock=lambda: now[0])
    theirs = []
    for _, ts in pts:
        now[0] = ts
        due = client.tick()
        if due:
            client.spent(cost)
        theirs.append(due)
    assert adaptive_keep(pts, cost=cost) == theirs
    assert 40 < sum(theirs) < 4000


def msg(type_: str, **kw: Any) -> str:
    m: Dict[str, Any] = {"type": type_}
    m.update(kw)
    return json.dumps(m, separators=(",", ":"))


def sample(step: int, ts: float, peak: int, phase: str = "train") -> str:
    stats = {"allocated_bytes.all.current": 100, "allocated_bytes.all.peak": peak}
    return msg("sample", ts=ts, step=step, phase=phase, stats=stats)


def test_thin_drops_skipped_train_samples_and_carries_their_peaks() -> None:
    lines = [msg("hello", v=1)]
    lines += [sample(s, 10.0 + s, 1000 + s) for s in range(1, 31)]  # 1 s steps: keeps 1, 9, 25
    lines.insert(12, msg("event", ts=21.5, kind="mark", detail="checkpoint"))
    lines.insert(14, sample(12, 22.5, 5000, phase="eval"))  # after step 12: sent, resets the peak
    lines.append(msg("bye", ts=40.0))
    out = thin(lines)
    parsed = [json.loads(x) for x in out]
    assert [(m["type"], m.get("step"), m.get("phase")) for m in parsed] == [
        ("hello", None, None),
        ("sample", 1, "train"),
        ("sample", 9, "train"),
        ("event", None, None),
        ("sample", 12, "eval"),
        ("sample", 25, "train"),
        ("bye", None, None),
    ]
    peaks = [m["stats"]["allocated_bytes.all.peak"] for m in parsed if m["type"] == "sample"]
    # Step 9 carries steps 2-9's highest peak, the eval sample steps 10-12's and its own, step 25
    # steps 13-25's.
    assert peaks == [1001, 1009, 5000, 1025]
    assert out[:2] == lines[:2] and out[3] == lines[12] and out[-1] == lines[-1]
    # A skipped sample with a higher peak than the one sent raises the sent one's.
    lines = [sample(1, 1.0, 10), sample(2, 2.0, 900), sample(3, 3.0, 10)] + [sample(s, float(s), 10) for s in range(4, 10)]
    assert [json.loads(x)["stats"]["allocated_bytes.all.peak"] for x in thin(lines)] == [10, 900]
