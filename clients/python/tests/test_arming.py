"""Arming (the daemon's `arm` request): recording on at once and bounded (time cap, disarm,
close), the step peak from one snapshot, shared with attribution windows, and a trainer that
cannot record saying so once. Snapshots are the real H100 OOM fixtures (tests/fixtures/torch-oom)."""

import logging
import os
import select
import time

import pytest

from gpumon_client import Client, StaticStatsSource, protocol
from gpumon_client.snapshot import load as snapload
from gpumon_client.testing import FakeDaemon
from test_attribution import AFTER, BEFORE, Recorder, steps

HERE = os.path.dirname(os.path.abspath(__file__))
OOMS = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-oom"))
FRAG = snapload.load(os.path.join(OOMS, "fragmentation.pickle"))


@pytest.fixture
def daemon(sock_path):
    with FakeDaemon(sock_path) as d:
        yield d


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def armed_client(sock_path, daemon, source, windows=None):
    """A client whose armer records with `source` (and whose attribution windows, if any, with
    `windows`), welcomed by the daemon."""
    # Each sample written at once: requests are read at writes, and these tests send them
    # between samples.
    c = Client("arm", source=StaticStatsSource({"num_ooms": 0}), socket=sock_path,
               attribution=windows or Recorder([FRAG, FRAG]), jitter=False, write_every=0)
    c.armer.source = source
    c.armer._monotonic = Clock()
    # Before the fixtures' history was recorded: every entry of it counts as recorded while armed.
    c.armer._clock = lambda: 1763700000.0
    c.sample(step=0)
    daemon.wait_for(1, type="hello")
    deadline = time.monotonic() + 3
    while c.stats()["session"] is None and time.monotonic() < deadline:
        time.sleep(0.001)
    return c


def arm(c, daemon, **fields):
    msg = {"type": "arm", "v": 1, "id": 2, "finding": "s-1/near_limit", "seconds": 900, "max_entries": 20000,
           "peak_after_steps": 3}
    msg.update(fields)
    daemon.send(msg)
    assert select.select([c.transport._sock], [], [], 3.0)[0], "the request never arrived"


def answers(daemon, kind, n=1):
    return [m for m in daemon.wait_for(n, type=kind) if m["type"] == kind]


def test_hello_offers_oom_history_and_env_turns_it_off(sock_path, daemon, monkeypatch):
    c = armed_client(sock_path, daemon, Recorder([FRAG, FRAG]))
    assert daemon.wait_for(1, type="hello")[0]["caps"][:2] == ["attribution", "oom_history"]
    monkeypatch.setenv("GPUMON_OOM_HISTORY", "0")
    assert Client(source=StaticStatsSource({}), socket=sock_path, attribution=Recorder([])).armer is None
    c.close()


def test_arm_records_at_once_sends_the_peak_after_its_steps_and_stops_at_the_time_cap(sock_path, daemon):
    rec = Recorder([FRAG, FRAG])
    c = armed_client(sock_path, daemon, rec)
    arm(c, daemon, max_entries=12345)
    c.sample(step=1)
    assert rec.calls == [("start", 12345)]
    assert answers(daemon, "armed") == [{"type": "armed", "id": 2, "ts": answers(daemon, "armed")[0]["ts"]}]
    steps(c, 2, 3)  # three recorded steps: the peak
    peak = answers(daemon, "peak")[0]
    assert peak["id"] == 2 and (peak["step_from"], peak["step_to"]) == (1, 4)
    # The highest live total in the history: what torch's own peak counter said.
    assert peak["peak_bytes"] == 2710568960
    top = peak["sites"][0]
    assert (os.path.basename(top["file"]), top["line"], top["blocks"]) == ("oomlib.py", 32, 360)
    assert "stop" not in rec.calls and c.armer.armed is not None
    c.armer._monotonic.t += 901
    steps(c, 5, 1)
    assert rec.calls[-1] == "stop" and c.armer.armed is None
    assert c.stats()["oom_history"] == {"armed": False, "answers": {"armed": 1}, "peaks": 1}
    c.close()


def test_disarm_and_close_switch_recording_off(sock_path, daemon):
    rec = Recorder([FRAG, FRAG])
    c = armed_client(sock_path, daemon, rec)
    arm(c, daemon, peak_after_steps=0)
    c.sample(step=1)
    daemon.send({"type": "disarm", "v": 1, "id": 2})
    assert select.select([c.transport._sock], [], [], 3.0)[0]
    c.sample(step=2)
    assert rec.calls == [("start", 20000), "stop"] and c.armer.armed is None
    arm(c, daemon, id=3, peak_after_steps=0)
    c.sample(step=3)
    c.close()
    assert rec.calls[-2:] == [("start", 20000), "stop"]
    assert not [m for m in daemon.messages() if m["type"] == "peak"]


def test_a_trainer_that_cannot_record_says_so_once(sock_path, daemon, caplog):
    import gpumon_client.arming as arming

    arming._said_unavailable = False
    caplog.set_level(logging.INFO, logger="gpumon_client")
    rec = Recorder([FRAG, FRAG], reason="CUDA is not available to torch 2.15; allocation history needs a CUDA device")
    c = armed_client(sock_path, daemon, rec)
    for rid in (2, 3):
        arm(c, daemon, id=rid)
        c.sample(step=rid)
    got = answers(daemon, "armed", 2)
    assert [(m["id"], m["error"]) for m in got] == [(2, "unavailable"), (3, "unavailable")]
    assert "CUDA is not available" in got[0]["detail"] and rec.calls == []
    said = [r for r in caplog.records if "cannot be kept for OOMs" in r.getMessage()]
    assert len(said) == 1
    c.close()


def test_a_bad_request_is_answered_failed_naming_the_problem(sock_path, daemon):
    rec = Recorder([FRAG, FRAG])
    c = armed_client(sock_path, daemon, rec)
    arm(c, daemon, seconds=-1, peak_after_steps="x")
    c.sample(step=1)
    got = answers(daemon, "armed")[0]
    assert got["error"] == "failed" and "seconds must be a positive number" in got["detail"]
    assert "peak_after_steps must be a whole number" in got["detail"] and rec.calls == []
    c.close()


def test_a_failed_peak_snapshot_is_answered_and_recording_goes_on_to_its_cap(sock_path, daemon):
    rec = Recorder([FRAG, FRAG], fail={"snapshot1": RuntimeError("CUDA error: an illegal memory access")})
    c = armed_client(sock_path, daemon, rec)
    arm(c, daemon, peak_after_steps=1)
    c.sample(step=1)
    steps(c, 2, 1)
    peak = answers(daemon, "peak")[0]
    assert peak["error"] == "failed" and "illegal memory access" in peak["detail"] and "sites" not in peak
    assert c.armer.armed is not None and "stop" not in rec.calls
    c.close()


def test_an_attribution_window_rides_on_the_armed_recording(sock_path, daemon, pair_paths=(BEFORE, AFTER)):
    arm_rec = Recorder([FRAG, FRAG])
    win_rec = Recorder([snapload.load(p) for p in pair_paths])
    c = armed_client(sock_path, daemon, arm_rec, windows=win_rec)
    arm(c, daemon, peak_after_steps=0)
    c.sample(step=1)
    daemon.attribute(id=5, steps=2)
    assert select.select([c.transport._sock], [], [], 3.0)[0]
    c.sample(step=2)
    steps(c, 3, 4)
    got = [m for m in daemon.wait_for(1, type="attribution") if m["type"] == "attribution"][0]
    assert got["id"] == 5 and "sites" in got, got  # not refused as "another session is recording"
    assert arm_rec.calls == [("start", 20000)] and c.armer.armed is not None
    c.close()


def test_an_arm_while_a_window_records_starts_once_the_window_ended(sock_path, daemon):
    arm_rec = Recorder([FRAG, FRAG])
    win_rec = Recorder([snapload.load(BEFORE), snapload.load(AFTER)])
    c = armed_client(sock_path, daemon, arm_rec, windows=win_rec)
    daemon.attribute(id=1, steps=2)
    assert select.select([c.transport._sock], [], [], 3.0)[0]
    c.sample(step=1)
    assert c.attributor.window is not None
    arm(c, daemon, peak_after_steps=0)
    c.sample(step=2)
    assert arm_rec.calls == [] and not [m for m in daemon.messages() if m["type"] == "armed"]
    steps(c, 3, 4)  # the window ends (its answer goes out), then the arming starts recording
    assert c.attributor.window is None and arm_rec.calls == [("start", 20000)]
    assert answers(daemon, "armed")[0].get("error") is None  # `armed` once it records
    c.close()


def test_reporter_steps_move_the_arming_to_its_peak_and_its_time_cap(sock_path, daemon):
    # Reporter.report() (as attach() and the callbacks) is the step boundary an arming needs.
    from gpumon_client import Reporter

    rec = Recorder([FRAG, FRAG])
    r = Reporter("rep", source=StaticStatsSource({"num_ooms": 0}), socket=sock_path, attribution=Recorder([FRAG, FRAG]),
                 write_every=0)
    r.client.armer.source = rec
    r.client.armer._monotonic = Clock()
    r.client.armer._clock = lambda: 1763700000.0
    r.report(0)
    daemon.wait_for(1, type="hello")
    deadline = time.monotonic() + 3
    while r.client.stats()["session"] is None and time.monotonic() < deadline:
        time.sleep(0.001)
    arm(r.client, daemon, peak_after_steps=2)
    for step in range(1, 4):
        r.report(step)
    assert answers(daemon, "peak")[0]["peak_bytes"] == 2710568960
    r.client.armer._monotonic.t += 901
    r.report(4)
    assert rec.calls[-1] == "stop" and r.client.armer.armed is None
    r.close()


def test_parse_arm_and_disarm():
    r = protocol.parse_arm({"type": "arm", "v": 1, "id": 4, "seconds": 60, "max_entries": 10 ** 9})
    assert (r.id, r.seconds, r.max_entries, r.peak_after_steps, r.problem) == (4, 60.0, protocol.MAX_ENTRIES, 0, None)
    assert protocol.parse_arm({"type": "disarm", "id": 4}).disarm
    assert protocol.parse_arm({"type": "arm", "id": "x"}) is None
    assert "version 2" in protocol.parse_arm({"type": "arm", "v": 2, "id": 1}).problem



def test_the_peak_counts_only_what_was_recorded_while_armed(sock_path, daemon):
    rec = Recorder([FRAG, FRAG])
    c = armed_client(sock_path, daemon, rec)
    c.armer._clock = lambda: 4102444800.0  # armed after every entry of the fixture's history
    arm(c, daemon, peak_after_steps=1)
    c.sample(step=1)
    steps(c, 2, 1)
    peak = answers(daemon, "peak")[0]
    assert peak["error"] == "failed" and "no entry since recording began" in peak["detail"]
    c.close()


@pytest.mark.parametrize("case", ["pressure", "fragmentation", "leak"])
def test_the_replayed_peak_is_torchs_own_peak_counter(case):
    import json

    from gpumon_client.snapshot import peak

    with open(os.path.join(OOMS, case + ".json")) as f:
        stats = json.load(f)["stats_at_oom"]
    found = peak.find(snapload.load(os.path.join(OOMS, case + ".pickle")))
    assert found.peak_bytes == stats["allocated_bytes.all.peak"]
    assert sum(s.bytes for s in found.sites) <= found.peak_bytes
