"""The daemon's line rate limit: the client paces its samples under the welcome's
max_lines_per_second and slows down when the daemon says rate_limited, instead of being cut off."""

import time

from gpumon_client import Reporter, StaticStatsSource
from gpumon_client.cadence import Throttle
from gpumon_client.testing import FakeDaemon

import sample_stats


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def allowed_per_second(throttle: Throttle, clock: Clock, calls: int = 2000) -> int:
    """Samples let through in one second of `calls` evenly spaced attempts."""
    n = 0
    for _ in range(calls):
        clock.t += 1.0 / calls
        n += throttle.allow()
    return n


def test_no_known_limit_lets_every_sample_through():
    clock = Clock()
    t = Throttle(clock)
    assert allowed_per_second(t, clock) == 2000
    for bad in (None, 0, -5, True, "100", float("nan")):
        t.set_limit(bad)
        assert t.limit is None and allowed_per_second(t, clock) == 2000, bad
    t.limited()  # a notice without a known limit: nothing to halve yet
    assert allowed_per_second(t, clock) == 2000 and t.skipped == 0


def test_samples_stay_under_the_limit_and_halve_for_a_while_after_a_notice():
    clock = Clock()
    t = Throttle(clock)
    t.set_limit(100)
    got = [allowed_per_second(t, clock)]
    assert 155 <= got[-1] <= 160  # a burst of one second's worth, then 80 % of the limit
    got.append(allowed_per_second(t, clock))
    assert 75 <= got[-1] <= 80
    t.limited()
    got.append(allowed_per_second(t, clock))
    assert 38 <= got[-1] <= 40
    t.limited()
    got.append(allowed_per_second(t, clock))
    assert 18 <= got[-1] <= 20
    got += [allowed_per_second(t, clock) for _ in range(10)]
    assert 75 <= got[-1] <= 80  # the slowdown wears off, 10 s after the last notice
    assert t.skipped == 14 * 2000 - sum(got)


def test_a_few_fast_steps_in_a_row_all_go():
    clock = Clock()
    t = Throttle(clock)
    t.set_limit(1000)
    assert all(t.allow() for _ in range(5)) and t.skipped == 0


def samples(d: FakeDaemon, since: float = 0.0) -> list:
    return [m for m in d.messages() if m["type"] == "sample" and m["ts"] >= since]


def test_a_reporter_at_twice_the_limit_paces_itself_and_stays_connected(sock_path):
    d = FakeDaemon(sock_path, welcome=False).start()
    try:
        # Each sample written at once: the test counts what reached the daemon by a time.
        r = Reporter("fast", source=StaticStatsSource(sample_stats.STATS), socket=sock_path, write_every=0)
        r.report(0)
        d.wait_for(1, type="hello")
        d.send({"type": "welcome", "v": 1, "server": "gpumon-fake/0", "session": "s-1", "max_lines_per_second": 50})

        def run(seconds: float) -> float:
            # 2,000 report() calls a second, like a trainer stepping every half millisecond.
            start = time.time()
            step = 0
            while time.time() - start < seconds:
                step += 1
                r.report(step)
                time.sleep(0.0005)
            return time.time()

        start = time.time()
        end = run(1.5)
        time.sleep(0.2)
        stats = r.stats()
        assert stats["max_lines_per_second"] == 50
        paced = len(samples(d, end - 1.0))
        assert 30 <= paced <= 41, paced  # at most 80 % of 50/s
        assert stats["rate_skipped"] > 1000
        assert len(samples(d, start)) <= 0.8 * 50 * 2.5 + 2  # one second's burst, then paced

        # The daemon says it dropped lines: the client halves its rate, on the same connection.
        d.send({"type": "error", "code": "rate_limited", "line": 40, "message": "more than 50 lines/s"})
        end = run(2.5)
        time.sleep(0.2)
        slowed = len(samples(d, end - 1.0))
        assert 14 <= slowed <= 21, slowed
        stats = r.stats()
        assert stats["errors"] == {"rate_limited": 1}
        assert stats["connected"] and stats["connects"] == 1

        r.close()
        assert d.wait_for(1, type="bye")
    finally:
        d.stop()
