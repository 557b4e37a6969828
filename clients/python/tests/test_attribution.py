"""Attribution windows (attribution.py) without torch: the `attribute` request read from real
sockets, the window's order of start / snapshot / stop on every path, the answer's line budget,
and the answers for what cannot be done (unavailable, failed, cut_short).

Snapshots come from the H100 fixture pickles (tests/fixtures/torch-snapshots) or from small
snapshot dicts built here; everything else is the client's real code on real Unix sockets."""

import json
import os
import select
import socket
import subprocess
import sys
import time

import pytest

from gpumon_client import Client, Reporter, StaticStatsSource, attribution, protocol, testing
from gpumon_client.cadence import Cadence
from gpumon_client import hooks
from gpumon_client.hooks import Attachment
from gpumon_client.snapshot.load import load
from gpumon_client.snapsource import ReplaySnapshotSource, SnapshotSource, TorchSnapshotSource, Unavailable
from gpumon_client.testing import FakeDaemon
from gpumon_client.transport import Transport

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(ROOT))
SNAPS = os.path.join(REPO, "tests", "fixtures", "torch-snapshots")
BEFORE = os.path.join(SNAPS, "leak-kept-outputs-step60.pickle")
AFTER = os.path.join(SNAPS, "leak-kept-outputs-step180.pickle")
MIB = 1 << 20


@pytest.fixture(scope="module")
def pair():
    return load(BEFORE), load(AFTER)


@pytest.fixture(autouse=True)
def no_injected_snapshots(monkeypatch):
    monkeypatch.delenv("GPUMON_ATTRIBUTION", raising=False)
    yield
    testing.use_snapshots(None)


class Recorder(SnapshotSource):
    """A snapshot source that logs what the window asks of it; `fail` maps a call ("start",
    "snapshot1", "snapshot2", "stop") to the exception it raises."""

    def __init__(self, snaps, fail=None, reason=None):
        self.snaps = snaps
        self.fail = fail or {}
        self.reason = reason
        self.calls = []
        self._n = 0

    def unavailable(self):
        return self.reason

    def _call(self, name, *args):
        self.calls.append((name,) + args if args else name)
        if name in self.fail:
            raise self.fail[name]

    def start(self, max_entries):
        self._n = 0
        self._call("start", max_entries)

    def snapshot(self):
        self._n += 1
        self._call("snapshot%d" % self._n)
        return self.snaps[(self._n - 1) % 2]

    def stop(self):
        self._call("stop")


@pytest.fixture
def daemon(sock_path):
    with FakeDaemon(sock_path) as d:
        yield d


def connect(sock_path, daemon, snapshots, job="t", **kw):
    """A client with its own connection, welcomed: requests sent to connection -1 reach it."""
    hellos = len([m for m in daemon.messages() if m["type"] == "hello"])
    # Each sample written at once: requests are read at writes, and these tests send them
    # between samples.
    kw.setdefault("write_every", 0)
    c = Client(job, source=StaticStatsSource({"num_ooms": 0}), socket=sock_path, attribution=snapshots, jitter=False, **kw)
    c.sample(step=0)
    daemon.wait_for(hellos + 1, type="hello")
    deadline = time.monotonic() + 3
    while c.stats()["session"] is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert c.stats()["session"] is not None
    return c


def ask(c, daemon, connection=-1, **fields):
    """The daemon sends a request; returns once the client's socket has it to read."""
    fields.setdefault("steps", 3)
    daemon.attribute(connection=connection, **fields)
    assert select.select([c.transport._sock], [], [], 3.0)[0], "the request never arrived"


def steps(c, first, n):
    """n training steps as a hand-written loop with explicit steps reports them."""
    for s in range(first, first + n):
        c.at_step(s)
        c.sample(step=s)
    return first + n


def answers(daemon, n=1):
    return [m for m in daemon.wait_for(n, type="attribution") if m["type"] == "attribution"]


# --- the request, on the wire ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"steps": 0}, "steps must be a positive integer"),
        ({"steps": "many"}, "steps must be a positive integer"),
        ({"seconds": -1}, "seconds must be a positive number"),
        ({"steps": None, "seconds": None}, "neither steps nor seconds bounds the window"),
        ({"max_entries": 0}, "max_entries must be a positive integer"),
        ({"top": True}, "top must be a positive integer"),
        ({"v": 2}, "attribute request version 2 not supported (this client speaks 1)"),
    ],
)
def test_requests_that_cannot_be_followed_name_why(fields, problem):
    obj = {"type": "attribute", "v": 1, "id": 4, "steps": 20, "seconds": 60}
    obj.update(fields)
    obj = {k: v for k, v in obj.items() if v is not None}
    req = protocol.parse_request(obj)
    assert req.id == 4 and problem in req.problem


def test_request_defaults_and_caps():
    req = protocol.parse_request({"type": "attribute", "id": 0, "seconds": 30, "max_entries": 10**9, "top": 99})
    assert (req.steps, req.seconds, req.max_entries, req.top, req.problem) == (None, 30.0, 100000, 20, None)
    assert protocol.parse_request({"type": "attribute", "steps": 5}) is None  # no id: nothing can answer
    assert protocol.parse_request({"type": "attribute", "id": -1, "steps": 5}) is None


def test_requests_read_from_a_socketpair_across_partial_lines():
    # The daemon's end of a real socketpair writes a request in pieces, a malformed line and an
    # id-less request between them; the client's transport reads at each send, without blocking.
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    t = Transport(lambda: protocol.hello(pid=1), paths=lambda: [], read_every=1, jitter=False)
    t._sock, t.connects, t.session = ours, 1, "s-1"
    line = b'{"type":"attribute","v":1,"id":7,"finding":"s-1/leak","steps":40,"seconds":90,"max_entries":500,"top":5}\n'
    theirs.sendall(line[:30])
    t.send(protocol.sample(1.0, {}, step=1))
    assert not t.requests
    theirs.sendall(line[30:] + b'not json\n{"type":"attribute","steps":3}\n{"type":"welcome","v":1,"server":"x","session":"s-1"}\n')
    t.send(protocol.sample(2.0, {}, step=2))
    assert [(conn, r.id, r.steps, r.seconds, r.max_entries, r.top) for conn, r in t.requests] == [(1, 7, 40, 90.0, 500, 5)]
    assert t.stats()["bad_replies"] == 2
    sent = theirs.recv(65536).splitlines()
    assert [json.loads(x)["step"] for x in sent] == [1, 2]
    ours.close()
    theirs.close()


def test_hello_announces_attribution_only_when_offered(sock_path, daemon, monkeypatch):
    static = StaticStatsSource({"num_ooms": 0})
    assert Client(source=static, socket=sock_path).attributor is None  # no torch, nothing injected
    assert Client(source=static, socket=sock_path, attribution=True).attributor.source.__class__ is TorchSnapshotSource
    testing.use_snapshots(BEFORE, AFTER)
    c = Client("caps", source=static, socket=sock_path)
    assert isinstance(c.attributor.source, ReplaySnapshotSource)
    assert Client(source=static, socket=sock_path, attribution=False).attributor is None
    monkeypatch.setenv("GPUMON_ATTRIBUTION", "0")
    assert Client(source=static, socket=sock_path).attributor is None
    monkeypatch.setenv("GPUMON_ATTRIBUTION", "1")
    testing.use_snapshots(None)
    assert isinstance(Client(source=static, socket=sock_path).attributor.source, TorchSnapshotSource)
    monkeypatch.delenv("GPUMON_ATTRIBUTION")
    c.sample(step=1)
    hello = daemon.wait_for(1, type="hello")[0]
    assert hello["caps"] == ["attribution", "oom_history", "ack"]
    assert c.transport.read_every == 1 and Client(source=static, socket=sock_path).transport.read_every == 32


# --- the window ------------------------------------------------------------------------------------


def test_window_records_one_step_then_snapshots_then_stops_then_answers(sock_path, daemon, pair):
    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    ask(c, daemon, id=3, steps=4, max_entries=250000, top=5)
    c.sample(step=10)  # the request is taken as this sample goes out: recording starts now
    assert rec.calls == [("start", 100000)] and c.attributor.window is not None
    steps(c, 11, 1)  # one full step recorded: the first snapshot
    assert rec.calls == [("start", 100000), "snapshot1"]
    steps(c, 12, 3)
    assert rec.calls == [("start", 100000), "snapshot1"] and c.attributor.window is not None
    steps(c, 15, 1)  # 4 steps after the first snapshot: the second, recording off, the answer
    assert rec.calls == [("start", 100000), "snapshot1", "snapshot2", "stop"]
    assert c.attributor.window is None
    (a,) = answers(daemon)
    assert (a["id"], a["step_from"], a["step_to"]) == (3, 11, 15)
    assert a["total_growth_bytes"] == 120 * MIB and a["seconds"] >= 0
    top = a["sites"][0]
    assert (os.path.basename(top["file"]), top["line"], top["function"], top["bytes"], top["blocks"]) == (
        "train.py", 27, "kept_outputs", 120 * MIB, 120)
    assert top["stack"][0] == {"file": top["file"], "line": 27, "function": "kept_outputs"}
    assert "error" not in a
    assert c.stats()["attribution"]["answers"] == {"sites": 1}
    steps(c, 16, 5)
    assert rec.calls[-1] == "stop" and len(rec.calls) == 4  # nothing after the window


def test_seconds_end_the_window_before_its_steps(sock_path, daemon, pair):
    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    now = [100.0]
    c.attributor._monotonic = lambda: now[0]
    ask(c, daemon, steps=1000, seconds=5)
    c.sample(step=1)
    steps(c, 2, 3)
    assert c.attributor.window is not None
    now[0] += 5.0
    steps(c, 5, 1)
    (a,) = answers(daemon)
    assert a["seconds"] == 5.0 and (a["step_from"], a["step_to"]) == (2, 5)


def test_the_same_step_twice_counts_once_and_unnumbered_steps_each_count(sock_path, daemon, pair):
    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    ask(c, daemon, steps=2)
    c.sample(step=1)
    for _ in range(3):
        c.at_step(1)  # the step the request came at: not a boundary
    assert rec.calls == [("start", 4000)]
    c.at_step(2)
    c.at_step(2)  # e.g. a callback's eval sample at the same global step
    c.at_step(3)
    assert rec.calls == [("start", 4000), "snapshot1"]
    c.at_step(4)
    assert rec.calls[-1] == "stop"
    ask(c, daemon, id=2, steps=2)
    c.sample()  # a timer sample: no step number
    for _ in range(3):
        c.at_step()
    assert rec.calls[-3:] == ["snapshot1", "snapshot2", "stop"]
    assert [a["id"] for a in answers(daemon, 2)] == [1, 2]


@pytest.mark.parametrize(
    "fail, stage, calls",
    [
        ("snapshot1", "the first snapshot raised RuntimeError: CUDA error: misaligned address",
         [("start", 4000), "snapshot1", "stop"]),
        ("snapshot2", "the second snapshot raised RuntimeError: CUDA error: misaligned address",
         [("start", 4000), "snapshot1", "snapshot2", "stop"]),
    ],
)
def test_a_snapshot_that_raises_is_failed_and_recording_goes_off(sock_path, daemon, pair, fail, stage, calls):
    rec = Recorder(pair, fail={fail: RuntimeError("CUDA error: misaligned address\nmore text")})
    c = connect(sock_path, daemon, rec)
    ask(c, daemon, steps=2)
    c.sample(step=1)
    steps(c, 2, 4)  # the trainer goes on: nothing reaches it
    assert rec.calls == calls and c.attributor.window is None
    (a,) = answers(daemon)
    assert (a["error"], a["detail"]) == ("failed", stage)
    assert c.stats()["internal_errors"] == 0


def test_a_diff_that_raises_is_failed_after_recording_went_off(sock_path, daemon, pair):
    rec = Recorder([pair[0], {"not": "a snapshot"}])
    c = connect(sock_path, daemon, rec)
    ask(c, daemon, steps=1)
    c.sample(step=1)
    steps(c, 2, 2)
    assert rec.calls == [("start", 4000), "snapshot1", "snapshot2", "stop"]
    (a,) = answers(daemon)
    assert a["error"] == "failed" and a["detail"].startswith("the diff raised SnapshotError: after:")


def test_history_that_recorded_no_stacks_is_failed_not_an_empty_answer(sock_path, daemon, pair):
    bare = {"segments": [{"device": 0, "blocks": [{"state": "active_allocated", "size": 8 * MIB, "frames": []}]}]}
    c = connect(sock_path, daemon, Recorder([bare, bare]))
    ask(c, daemon, steps=1)
    c.sample(step=1)
    steps(c, 2, 2)
    (a,) = answers(daemon)
    assert a["error"] == "failed" and "allocation history was not recorded" in a["detail"]


def test_recording_refused_unavailable_and_bad_requests(sock_path, daemon, pair):
    refused = Recorder(pair, fail={"start": RuntimeError("CUDA driver refused")})
    c = connect(sock_path, daemon, refused)
    ask(c, daemon, id=1)
    c.sample(step=1)
    assert refused.calls == [("start", 4000), "stop"] and c.attributor.window is None
    old = Recorder(pair, fail={"start": Unavailable("torch 2.0's _record_memory_history takes no max_entries")})
    c2 = connect(sock_path, daemon, old, job="old")
    ask(c2, daemon, id=1)
    c2.sample(step=1)
    nocuda = Recorder(pair, reason="CUDA is not available to torch 2.5.1; allocation history needs a CUDA device")
    c3 = connect(sock_path, daemon, nocuda, job="nocuda")
    ask(c3, daemon, id=1)
    ask(c3, daemon, id=2, steps=0)
    daemon.send(b'{"type":"attribute","steps":3}')  # no id: ignored, counted
    c3.sample(step=1)
    got = [(a["id"], a["error"], a["detail"]) for a in answers(daemon, 4)]
    assert got == [
        (1, "failed", "recording allocation history was refused: RuntimeError: CUDA driver refused"),
        (1, "unavailable", "torch 2.0's _record_memory_history takes no max_entries"),
        (1, "unavailable", "CUDA is not available to torch 2.5.1; allocation history needs a CUDA device"),
        (2, "failed", "bad request: steps must be a positive integer"),
    ]
    assert old.calls == [("start", 4000), "stop"]
    assert nocuda.calls == []  # never started
    assert c3.stats()["bad_replies"] == 1


def test_the_real_source_says_why_without_torch(sock_path, daemon, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as where it is absent
    c = connect(sock_path, daemon, True)
    ask(c, daemon)
    c.sample(step=1)
    (a,) = answers(daemon)
    assert a["error"] == "unavailable" and a["detail"].startswith("torch is not importable")


def test_one_window_at_a_time_per_session_and_per_process(sock_path, daemon, pair):
    rec1, rec2 = Recorder(pair), Recorder(pair)
    c1 = connect(sock_path, daemon, rec1, job="one")
    c2 = connect(sock_path, daemon, rec2, job="two")
    ask(c1, daemon, connection=0, id=1, steps=2)
    c1.sample(step=1)
    ask(c1, daemon, connection=0, id=2, steps=2)
    ask(c2, daemon, connection=1, id=1, steps=2)
    c1.sample(step=1)
    c2.sample(step=1)
    steps(c1, 2, 3)
    answers(daemon, 3)

    def of(conn):
        return [(m["id"], m.get("error"), m.get("detail"), bool(m.get("sites")))
                for m in map(json.loads, daemon.connections[conn].lines) if m["type"] == "attribution"]

    assert of(0) == [(2, "failed", "a window is already open (request 1)", False), (1, None, None, True)]
    assert of(1) == [(1, "failed", "another session of this process is recording allocation history", False)]
    assert rec2.calls == []
    ask(c2, daemon, connection=1, id=2, steps=1)  # the first window is over: the process may record again
    c2.sample(step=2)
    steps(c2, 3, 2)
    answers(daemon, 4)
    assert of(1)[1] == (2, None, None, True) and rec2.calls[-1] == "stop"


def test_close_while_open_cuts_short_and_stops(sock_path, daemon, pair):
    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    ask(c, daemon, steps=50)
    c.sample(step=1)
    steps(c, 2, 6)
    c.close()
    assert rec.calls[-1] == "stop" and c.attributor.window is None
    msgs = daemon.wait_for(1, type="bye")
    a = [m for m in msgs if m["type"] == "attribution"][0]
    assert (a["error"], a["detail"], a["step_from"], a["step_to"]) == (
        "cut_short", "the trainer stopped reporting, 5 step(s) into the window", 2, 7)
    assert [m["type"] for m in msgs[-2:]] == ["attribution", "bye"]


def test_detach_before_the_first_snapshot_cuts_short(sock_path, daemon, pair):
    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    state = Attachment(c, Cadence(every=1, max_rate=None, budget=None))
    ask(c, daemon, steps=50)
    state.on_optimizer_step(object())  # samples step 1 (the cadence's first), takes the request
    state.detach()
    assert rec.calls == [("start", 4000), "stop"]
    (a,) = answers(daemon)
    assert a["error"] == "cut_short" and "step_from" not in a
    assert a["detail"] == "the trainer stopped reporting, before the window began (recording, its first step not over)"


def test_a_lost_connection_ends_the_window_unanswered(sock_path, pair):
    rec = Recorder(pair)
    d = FakeDaemon(sock_path, session="s-a").start()
    c = connect(sock_path, d, rec, backoff_initial=0.01)
    ask(c, d, steps=100)
    c.sample(step=1)
    steps(c, 2, 2)
    d.stop()
    d2 = FakeDaemon(sock_path, session="s-b").start()
    try:
        s = 4
        deadline = time.monotonic() + 5
        while c.stats()["connects"] < 2 and time.monotonic() < deadline:
            s = steps(c, s, 1)
            time.sleep(0.005)
        s = steps(c, s, 3)
        assert rec.calls[-1] == "stop" and c.attributor.window is None
        assert c.stats()["attribution"]["lost"] == 1
        c.close()
        assert [m["type"] for m in d2.wait_for(1, type="bye")].count("attribution") == 0
    finally:
        d2.stop()


def test_an_uncaught_exception_cuts_the_window_short_and_recording_goes_off(sock_path, daemon):
    code = """
import atexit, sys
sys.path.insert(0, %(root)r)
src = []
atexit.register(lambda: print("calls", src[0].calls, flush=True))  # runs after the client's close
import time
from gpumon_client import Client, StaticStatsSource, testing
src.append(testing.use_snapshots(%(before)r, %(after)r))
c = Client("dies", source=StaticStatsSource({"num_ooms": 0}), socket=%(sock)r)
step = 0
while c.attributor.window is None or c.attributor.window.before is None:  # until the window began
    step += 1
    c.at_step(step)
    c.sample(step=step)
    time.sleep(0.005)
raise RuntimeError("boom at step %%d" %% step)
""" % {"root": ROOT, "before": BEFORE, "after": AFTER, "sock": sock_path}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon.wait_for(2, timeout=20)
    daemon.attribute(id=1, steps=100)
    out, err = child.communicate(timeout=30)
    msgs = daemon.wait_for(1, type="event", timeout=5)
    died = msgs[-1]["detail"]
    assert child.returncode == 1 and died.split(": ", 1)[1] in err and died.startswith("trainer died: RuntimeError: boom at step")
    assert [m["type"] for m in msgs[-2:]] == ["attribution", "event"] and "bye" not in [m["type"] for m in msgs]
    a = msgs[-2]
    assert (a["error"], a["detail"]) == ("cut_short", died + ", 0 step(s) into the window")
    assert "'stop'" in out.split("calls", 1)[1] and out.strip().endswith("('stop',)]")


# --- the step paths --------------------------------------------------------------------------------


def test_steps_without_a_window_make_no_syscall_and_no_window_call(sock_path, daemon, pair):
    class Counting:
        def __init__(self, sock):
            self.sock, self.calls = sock, []

        def __getattr__(self, name):
            attr = getattr(self.sock, name)
            if name not in ("send", "recv"):
                return attr

            def counted(*a, **k):
                self.calls.append(name)
                return attr(*a, **k)

            return counted

    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    wrapped = c.transport._sock = Counting(c.transport._sock)
    window_calls = []
    real_at_step = c.attributor.at_step
    c.attributor.at_step = lambda step: (window_calls.append(step), real_at_step(step))
    state = Attachment(c, Cadence(every=4, max_rate=None, budget=None))
    opt = object()
    per_step = []
    for _ in range(40):
        before = len(wrapped.calls)
        state.on_optimizer_step(opt)
        per_step.append(wrapped.calls[before:])
    sampled = [i + 1 for i, calls in enumerate(per_step) if calls]
    assert sampled == list(range(1, 41, 4))  # the cadence's steps, and only those, touch the socket
    assert all(calls == ["send", "recv"] for calls in per_step if calls)  # one read per sample
    assert window_calls == []
    ask(c, daemon, steps=3)
    for _ in range(8):
        state.on_optimizer_step(opt)
    assert window_calls == [42, 43, 44, 45]  # taken at step 41's sample; the window's steps only
    assert rec.calls == [("start", 4000), "snapshot1", "snapshot2", "stop"]
    assert answers(daemon)[0]["step_from"] == 42


def test_the_registered_hook_skips_the_steps_its_cadence_need_not_see(sock_path, daemon, pair, monkeypatch):
    # The hook torch calls (_optimizer_hook): steps inside the cadence's wait only count, and the
    # ones it looks at are the rule's; a window that opens at a sample makes every step take the
    # whole path, so the window still moves on at each of its steps.
    rec = Recorder(pair)
    c = connect(sock_path, daemon, rec)
    window_calls = []
    real_at_step = c.attributor.at_step
    c.attributor.at_step = lambda step: (window_calls.append(step), real_at_step(step))
    decisions = []
    cadence = Cadence(every=4, max_rate=None, budget=None)
    real_due = cadence.due
    cadence.due = lambda steps=1: (decisions.append(steps), real_due(steps))[1]
    state = Attachment(c, cadence)
    monkeypatch.setattr(hooks, "_state", state)

    class Optimizer:
        pass

    opt = Optimizer()
    sent = c.transport.sent_lines
    for _ in range(40):
        hooks._optimizer_hook(opt, (), {})
    assert state.step == 40 and c.transport.sent_lines - sent == 10  # steps 1, 5, ..., 37
    assert decisions == [1] + [4] * 9  # one decision per sample: the 3 steps between only count
    assert window_calls == []
    ask(c, daemon, steps=3)
    for _ in range(8):
        hooks._optimizer_hook(opt, (), {})
    assert state.step == 48
    assert window_calls == [42, 43, 44, 45]  # taken at step 41's sample; every step of the window
    assert answers(daemon)[0]["step_from"] == 42
    # A second optimizer: each training step steps both, and is counted once.
    other = Optimizer()
    for _ in range(6):
        hooks._optimizer_hook(opt, (), {})
        hooks._optimizer_hook(other, (), {})
    assert state.step == 54
    # An optimizer without weak references takes the whole path at every step, and counts the
    # same (its first call joins the step the other two were in).
    del decisions[:]
    bare = object()
    for _ in range(8):
        hooks._optimizer_hook(bare, (), {})
    assert state.step == 61 and decisions == [1] * 7


def test_reporter_steps_move_the_window(sock_path, daemon, pair):
    rec = Recorder(pair)
    r = Reporter("rep", source=StaticStatsSource({"num_ooms": 0}), socket=sock_path, attribution=rec)
    r.report(1)
    daemon.wait_for(1, type="hello")
    ask(r.client, daemon, steps=2)
    for s in range(2, 6):
        r.report(s)
    assert rec.calls[-1] == "stop"
    (a,) = answers(daemon)
    assert (a["step_from"], a["step_to"]) == (3, 5)
    r.close()


# --- the line budget -------------------------------------------------------------------------------


def _snapshot(blocks):
    return {"segments": [{"device": 0, "address": 0, "total_size": sum(b[0] for b in blocks), "blocks": [
        {"address": i, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
        for i, (size, frames) in enumerate(blocks)]}], "device_traces": [[]]}


def test_a_large_answer_is_trimmed_to_one_line_within_the_protocols_limits(sock_path, daemon):
    deep = "/home/u/proj/" + "d" * 600  # file names past the 512-byte limit
    blocks = []
    for site in range(30):
        frames = [{"filename": "%s/mod%02d.py" % (deep, site), "line": 10 + k, "name": "f%d_%s" % (k, "é" * 300)}
                  for k in range(40)]
        blocks += [(2 * MIB + site * 4096, frames)] * 3
    c = connect(sock_path, daemon, Recorder([_snapshot([]), _snapshot(blocks)]))
    ask(c, daemon, steps=1, top=50)
    c.sample(step=1)
    steps(c, 2, 2)
    answers(daemon)
    raw = [line for line in daemon.lines if line.startswith(b'{"type":"attribution"')][0]
    assert len(raw) + 1 <= protocol.MAX_LINE - 1024
    a = json.loads(raw)
    assert 1 <= len(a["sites"]) <= protocol.MAX_SITES
    assert a["sites"][0]["bytes"] == 3 * (2 * MIB + 29 * 4096)  # the largest kept first
    for s in a["sites"]:
        assert len(s["stack"]) <= protocol.MAX_STACK
        for text in [s["file"], s["function"]] + [f[k] for f in s["stack"] for k in ("file", "function")]:
            assert len(text.encode()) <= protocol.MAX_STR
    assert a["total_growth_bytes"] == sum(b[0] for b in blocks)


def test_fit_line_drops_sites_when_needed():
    sites = [{"file": "/p/%03d.py" % i, "line": 1, "function": "f", "bytes": 1, "blocks": 1,
              "stack": [{"file": "/p/%03d.py" % i, "line": 1, "function": "f"}], "note": "n" * 500} for i in range(20)]
    msg = protocol.attribution(1, 1.0, 5, sites)
    msg["padding"] = "x" * 60000  # leaves room for a few sites only
    attribution.fit_line(msg)
    line = protocol.encode(msg)
    assert 0 < len(msg["sites"]) < 20 and len(line) <= protocol.MAX_LINE - 1024
    assert [s["file"] for s in msg["sites"]] == ["/p/%03d.py" % i for i in range(len(msg["sites"]))]


# --- the golden fixture ----------------------------------------------------------------------------


def test_the_attribution_fixture_is_what_the_client_sends():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", os.path.join(ROOT, "scripts", "gen_protocol_fixtures.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(os.path.join(REPO, "tests", "fixtures", "protocol", "client_attribution.jsonl"), "rb") as f:
        on_disk = f.read()
    assert on_disk == gen._capture(gen._attribution, pass_daemon=True)
    msgs = [json.loads(x) for x in on_disk.splitlines()]
    assert msgs[0]["caps"] == ["attribution", "oom_history", "ack"]
    done, cut = [m for m in msgs if m["type"] == "attribution"]
    assert done["sites"][0]["line"] == 27 and done["total_growth_bytes"] == 120 * MIB
    assert cut["error"] == "cut_short"
