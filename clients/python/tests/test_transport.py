import json
import re
import time

import pytest

from gpumon_client import protocol
from gpumon_client.testing import FakeDaemon
from gpumon_client.transport import Transport


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(path, **kw):
    kw.setdefault("jitter", False)
    return Transport(lambda: protocol.hello(pid=42, job="t"), paths=lambda: [path], **kw)


def msg(i):
    return protocol.sample(float(i), {"num_ooms": 0}, step=i)


def test_hello_first_then_lines_in_order(sock_path):
    with FakeDaemon(sock_path) as d:
        t = make(sock_path)
        for i in range(1, 41):
            t.send(msg(i))
        msgs = d.wait_for(41)
        assert msgs[0]["type"] == "hello" and msgs[0]["pid"] == 42
        assert [m["step"] for m in msgs[1:]] == list(range(1, 41))
        t.close(bye=protocol.bye(99.0))
        # Lines are numbered (`seq`, capability `ack`) until a welcome says the daemon does not ack:
        # the bye is the 41st numbered line unless the welcome was read before it was sent.
        assert d.wait_for(42)[-1] in ({"type": "bye", "ts": 99.0, "seq": 41}, {"type": "bye", "ts": 99.0})
    assert t.session == "s-1"  # the welcome was read
    assert t.stats()["dropped"] == 0


def test_daemon_absent_is_cheap_and_bounded(sock_path):
    # Counted, not timed (a loaded CI machine is slow, not wrong): one connect attempt, then the
    # backoff keeps every other send off the socket.
    attempts = []

    def paths():
        attempts.append(1)
        return [sock_path]

    t = Transport(lambda: protocol.hello(pid=42, job="t"), paths=paths, max_lines=10, backoff_initial=60, jitter=False)
    for i in range(1000):
        t.send(msg(i))
    st = t.stats()
    assert st["buffered"] == 10 and st["dropped"] == 990 and not st["connected"]
    assert len(attempts) == 1


def test_backoff_doubles_and_caps(sock_path):
    clock = Clock()
    attempts = []

    def paths():
        attempts.append(clock.t)
        return [sock_path]

    t = Transport(lambda: protocol.hello(pid=1), paths=paths, backoff_initial=0.1, backoff_max=1.0,
                  monotonic=clock, jitter=False)
    for _ in range(2000):
        t.send(msg(0))
        clock.t += 0.01
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    expected = [0.1, 0.2, 0.4, 0.8] + [1.0] * (len(gaps) - 4)
    # Attempts happen at the first send after the timer expires; sends are 0.01 apart.
    assert len(gaps) > 10
    assert all(e <= g < e + 0.011 for g, e in zip(gaps, expected)), gaps


def test_reconnect_sends_hello_then_drop_mark_then_newest(sock_path):
    clock = Clock()
    t = make(sock_path, max_lines=4, backoff_initial=0.5, monotonic=clock)
    for i in range(1, 7):  # daemon down: 1 and 2 are dropped
        t.send(msg(i))
    with FakeDaemon(sock_path) as d:
        t.send(msg(7))  # backoff not over yet: 3 is dropped, nothing sent
        assert d.wait_for(1, timeout=0.1) == []
        clock.t += 10
        t.send(msg(8))  # connects now; 4 is dropped
        msgs = d.wait_for(6)
        assert msgs[0]["type"] == "hello"
        assert msgs[1]["type"] == "event" and msgs[1]["kind"] == "mark" and msgs[1]["dropped"] == 4
        assert [m["step"] for m in msgs[2:]] == [5, 6, 7, 8]
    assert t.stats()["dropped"] == 4


def test_daemon_restart_reconnects_without_half_lines(sock_path):
    clock = Clock()
    t = make(sock_path, backoff_initial=0.01, monotonic=clock)
    d = FakeDaemon(sock_path, session="s-a").start()
    for i in range(1, 4):
        t.send(msg(i))
    d.wait_for(4)
    d.stop()
    # The client learns of the restart from a failed send or an EOF it reads; either way it
    # reconnects once the backoff allows and starts the new connection with hello.
    d2 = FakeDaemon(sock_path, session="s-b").start()
    try:
        for i in range(4, 200):
            t.send(msg(i))
            clock.t += 0.05
            time.sleep(0.001)
        msgs = d2.wait_for(10)
        assert msgs[0]["type"] == "hello"
        raw = b"".join(c.raw for c in d2.connections)
        assert raw.endswith(b"\n") and all(json.loads(x) for x in d2.lines)
        steps = [m["step"] for m in msgs if m["type"] == "sample"]
        assert steps == sorted(steps) and steps[-1] == 199
        assert t.stats()["connects"] == 2
    finally:
        d2.stop()


def test_slow_daemon_never_blocks_the_sender(sock_path):
    with FakeDaemon(sock_path, reading=False) as d:
        t = make(sock_path, max_lines=50)
        big = {"k%03d" % i: i * 1000003 for i in range(200)}
        worst = 0.0
        for i in range(3000):
            start = time.perf_counter()
            t.send(protocol.sample(float(i), big, step=i))
            worst = max(worst, time.perf_counter() - start)
        st = t.stats()
        assert st["connected"] and st["buffered"] == 50 and st["dropped"] > 0
        assert worst < 0.05
        d.resume_reading()
        for i in range(3000, 3100):
            t.send(protocol.sample(float(i), big, step=i))
            time.sleep(0.001)
        t.close(bye=protocol.bye(1.0), timeout=2.0)
        msgs = d.wait_for(1, type="bye")
        marks = [m for m in msgs if m["type"] == "event" and m["kind"] == "mark"]
        assert marks and sum(m["dropped"] for m in marks) == t.stats()["dropped"]
        steps = [m["step"] for m in msgs if m["type"] == "sample"]
        assert steps == sorted(steps) and steps[-1] == 3099
        assert len(steps) + t.stats()["dropped"] == 3100


def test_close_is_bounded_when_daemon_does_not_read(sock_path):
    with FakeDaemon(sock_path, reading=False):
        t = make(sock_path, max_lines=10000)
        big = {"k%03d" % i: i for i in range(300)}
        for i in range(2000):
            t.send(protocol.sample(float(i), big, step=i))
        start = time.monotonic()
        t.close(bye=protocol.bye(1.0), timeout=0.2)
        assert time.monotonic() - start < 1.0
        t.send(msg(1))  # closed: ignored, no error


def test_error_replies_are_counted(sock_path):
    with FakeDaemon(sock_path, error_code="bad_field") as d:
        t = make(sock_path)
        for i in range(100):
            t.send(msg(i))
            time.sleep(0.0005)
        d.wait_for(101)
        t.close(timeout=1.0)
    st = t.stats()
    assert st["errors"].get("bad_field", 0) > 0
    assert st["last_error"].startswith("bad_field")


def test_unencodable_message_is_skipped(sock_path):
    with FakeDaemon(sock_path) as d:
        t = make(sock_path)
        t.send({"type": "event", "ts": 1.0, "kind": "mark", "detail": "x" * 200000, "more": "y" * 200000})
        t.send(msg(1))
        msgs = d.wait_for(2)
        assert [m["type"] for m in msgs] == ["hello", "sample"]
        assert t.unencodable == 1


def _seqs(msgs):
    return [m.get("seq") for m in msgs if m["type"] != "hello"]


def test_unacknowledged_lines_go_again_on_the_next_connection(sock_path):
    clock = Clock()
    t = make(sock_path, monotonic=clock, backoff_initial=60, read_every=1)
    with FakeDaemon(sock_path, welcome=False) as d:
        t.send(msg(1))
        hello = d.wait_for(2)[0]
        assert "ack" in hello["caps"] and hello["instance"] == t.instance
        d.send({"type": "welcome", "v": 1, "server": "x", "session": "s-1", "ack": True})
        for i in range(2, 6):
            t.send(msg(i))
        assert _seqs(d.wait_for(6)) == [1, 2, 3, 4, 5]
        d.send({"type": "ack", "seq": 3})
        time.sleep(0.05)
        t.send(msg(6))
        d.wait_for(7)
        st = t.stats()
        assert (st["acked"], st["unacked"]) == (3, 3)
    # The daemon is gone; a new one binds the socket again. The backoff (60 s) has not run
    # out, but the socket file changed: the next send connects.
    t.send(msg(7))
    with FakeDaemon(sock_path, welcome=False) as d2:
        clock.t += 1  # past the look-at-the-socket-file interval, far inside the backoff
        t.send(msg(8))
        msgs = d2.wait_for(6)
        assert msgs[0]["type"] == "hello" and msgs[0]["instance"] == hello["instance"]
        assert _seqs(msgs) == [4, 5, 6, 7, 8], "everything unacknowledged, in order, then the new"
        assert [m["step"] for m in msgs[1:]] == [4, 5, 6, 7, 8]
        assert t.stats()["resent"] == 4  # 7 went to the dead connection first
        assert t.stats()["dropped"] == 0 and t.stats()["unconfirmed"] == 0


def test_a_daemon_that_does_not_ack_is_not_held_for(sock_path):
    t = make(sock_path, read_every=1, max_lines=4)
    with FakeDaemon(sock_path) as d:  # its welcome has no "ack"
        # Its welcome read first: until then lines are held as unconfirmed, for as long as a
        # loaded machine takes to deliver it.
        welcomed(d, t)
        for i in range(2, 20):
            t.send(msg(i))
        d.wait_for(20)
        st = t.stats()
        assert st["unacked"] == 0 and st["unconfirmed"] == 0 and st["dropped"] == 0


def test_held_lines_are_bounded_and_what_is_given_up_is_counted(sock_path):
    t = make(sock_path, read_every=1, max_lines=4)
    with FakeDaemon(sock_path, welcome=False) as d:
        for i in range(1, 11):
            t.send(msg(i))
        d.wait_for(11)
        st = t.stats()
        # Ten lines sent, none acknowledged: four held, six given up and counted as such.
        assert (st["unacked"], st["unconfirmed"], st["dropped"]) == (4, 6, 0)


def welcomed(d, t):
    """Sends the first sample (it goes at once) and waits until the welcome was read."""
    t.send(msg(1), True)
    d.wait_for(2)
    deadline = time.monotonic() + 3
    while t.stats()["session"] is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t.session == "s-1"


def batching(sock_path, d):
    """A transport that writes samples together (write_every 0.5 s, on a clock the test moves),
    welcomed, its last write sample 2's. Times are binary fractions, so sums are exact."""
    clock = Clock()
    t = make(sock_path, monotonic=clock, write_every=0.5)
    welcomed(d, t)
    clock.t += 0.75
    t.send(msg(2), True)  # the first write since the welcome: at once
    assert [m.get("step") for m in d.wait_for(3)] == [None, 1, 2]
    return t, clock


def test_samples_wait_for_the_next_write_and_an_event_takes_them_along(sock_path):
    with FakeDaemon(sock_path) as d:
        t, clock = batching(sock_path, d)
        for i in range(3, 6):
            clock.t += 0.125
            t.send(msg(i), True)
        time.sleep(0.2)
        assert len(d.messages()) == 3 and t.stats()["buffered"] == 3  # waiting, not sent
        t.send(protocol.event(9.0, "mark", detail="lr drop"))  # an event may not wait
        got = d.wait_for(7)
        assert [m.get("step") for m in got[3:6]] == [3, 4, 5] and got[6]["kind"] == "mark"
        t.send(msg(6), True)  # the sample after an event goes at once (a survived OOM shows)
        assert d.wait_for(8)[7]["step"] == 6
        t.send(msg(7), True)  # and the schedule starts again from it
        time.sleep(0.1)
        assert len(d.messages()) == 8


def test_waiting_samples_go_once_write_every_passed_or_when_many_wait(sock_path):
    with FakeDaemon(sock_path) as d:
        t, clock = batching(sock_path, d)
        t.send(msg(3), True)
        clock.t += 0.25
        t.send(msg(4), True)
        time.sleep(0.1)
        assert len(d.messages()) == 3
        clock.t += 0.25  # 0.5 s since the last write: 3 and 4 go with 5
        t.send(msg(5), True)
        assert [m["step"] for m in d.wait_for(6)[3:]] == [3, 4, 5]
        for i in range(6, 6 + 64):  # the clock stands still: 64 waiting is enough
            t.send(msg(i), True)
        assert [m["step"] for m in d.wait_for(70)[6:]] == list(range(6, 70))
        assert t.stats()["dropped"] == 0


def test_a_small_buffer_is_never_filled_by_waiting_samples(sock_path):
    with FakeDaemon(sock_path) as d:
        t = make(sock_path, write_every=60, max_lines=4)
        welcomed(d, t)
        for i in range(2, 12):  # at most half of max_lines wait
            t.send(msg(i), True)
        t.close()
        assert [m["step"] for m in d.wait_for(11)[1:]] == list(range(1, 12))
        assert t.stats()["dropped"] == 0


def test_close_writes_the_waiting_samples_before_the_bye(sock_path):
    with FakeDaemon(sock_path) as d:
        t = make(sock_path, write_every=60)
        welcomed(d, t)
        for i in range(2, 5):
            t.send(msg(i), True)
        t.close(bye=protocol.bye(99.0))
        got = d.wait_for(6)
        assert [m.get("step") for m in got[2:5]] == [2, 3, 4] and got[5]["type"] == "bye"


def test_samples_go_at_once_until_the_welcome_and_with_write_every_0(sock_path):
    with FakeDaemon(sock_path, welcome=False) as d:
        t = make(sock_path, write_every=60)
        for i in range(1, 4):
            t.send(msg(i), True)
        assert [m.get("step") for m in d.wait_for(4)] == [None, 1, 2, 3]
    with FakeDaemon(sock_path) as d:
        t = make(sock_path, write_every=0)
        welcomed(d, t)
        for i in range(2, 5):
            t.send(msg(i), True)
        assert [m.get("step") for m in d.wait_for(5)] == [None, 1, 2, 3, 4]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "0.5", True])
def test_a_bad_write_every_names_the_value(value):
    with pytest.raises(ValueError, match=r"write_every=%s" % re.escape(repr(value))):
        make("/nonexistent", write_every=value)
