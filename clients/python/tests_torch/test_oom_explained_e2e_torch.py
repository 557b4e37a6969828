"""An explained OOM end to end: a real-torch SGD loop attached to the real daemon binary; torch's
OOM observer (the one the client handed torch) is fired as the caching allocator fires it, with
the real H100 fragmentation snapshot standing in for `torch.cuda.memory._snapshot()` (the only call
stood in: there is no GPU here). The explanation must reach the finding message, the API, the
webhook, /metrics, the recorded trace, `gpumon analyze` and the TUI in a real terminal (tmux)."""

import json
import os
import shutil
import subprocess
import time
import uuid

import pytest

import support

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client.snapshot import load as snapload  # noqa: E402
from test_attribution_torch import Trainer, recorded_daemon  # noqa: E402,F401 (a fixture)
from test_daemon_e2e_torch import built, get, session_of, wait_until  # noqa: E402

FIXTURES = os.path.join(support.REPO_ROOT, "tests", "fixtures", "torch-oom")
JOB = "oom-e2e"
CAP = 4 << 30
EXACT = {"max_rate": None, "budget": None}


def oom_finding(base):
    status, body = get(base + "/api/v1/snapshot")
    assert status == 200, body
    snap = json.loads(body)
    s = [x for x in snap["sessions"] if x.get("job") == JOB]
    found = [f for f in snap.get("findings") or [] if s and f.get("session") == s[0]["session"] and f["kind"] == "oom"]
    return found[0] if found else None


def check_explained(where, finding):
    ex = finding["evidence"]["explanation"]
    assert ex["pattern"] == "fragmentation", (where, ex)
    assert (os.path.basename(ex["failing_site"]["file"]), ex["failing_site"]["line"]) == ("oomlib.py", 37), where
    assert (os.path.basename(ex["live_sites"][0]["file"]), ex["live_sites"][0]["line"]) == ("oomlib.py", 32), where
    msg = finding["message"]
    assert "fragmentation" in msg and "oomlib.py:37" in msg and "oomlib.py:32" in msg, (where, msg)


def test_an_oom_the_trainer_survives_is_explained_everywhere(recorded_daemon, monkeypatch, tmp_path):
    base, socket_path, logs, hook, records = recorded_daemon
    import torch.cuda.memory as memory

    snap = snapload.load(os.path.join(FIXTURES, "fragmentation.pickle"))
    monkeypatch.setattr(memory, "_snapshot", lambda *a, **k: snap)
    handed, _ = support.capture_oom_observers(torch, monkeypatch)
    queued = len(torch.cuda._queued_calls)
    handle = gpumon_client.attach(JOB, source=support.make_source(), socket=socket_path, **EXACT)
    assert handle.active
    support.run_cuda_init_callbacks(torch, queued)  # as if the trainer had now initialised CUDA
    t = Trainer()
    for _ in range(5):
        t.step()
    assert handed, "the client never gave torch an OOM observer"
    # c10/cuda/CUDACachingAllocator.cpp: observer(device, alloc_size, limit, device_free).
    handed[0](0, 1536 << 20, CAP, 70 << 30)
    wait_until(lambda: oom_finding(base), 10, "the oom finding", logs)
    check_explained("api snapshot", oom_finding(base))

    # The trainer caught it and went on: the next samples say it survived, so it does not page.
    for _ in range(5):
        t.step()
    wait_until(lambda: oom_finding(base)["evidence"].get("survived"), 10, "the OOM marked survived", logs)
    finding = oom_finding(base)
    assert finding["severity"] == "warning" and "went on" in finding["message"], finding
    session = session_of(base, JOB)
    status, body = get(base + "/api/v1/sessions/%s" % session["session"])
    assert status == 200, body
    one = json.loads(body)
    assert one["ooms"][0]["pattern"] == "fragmentation" and one["ooms"][0]["survived"], one["ooms"]
    status, metrics = get(base + "/metrics")
    assert 'gpumon_ooms_total{pattern="fragmentation"} 1' in metrics, metrics

    wait_until(lambda: [f for f in hook.findings() if f.get("kind") == "oom"], 15, "a webhook post of the oom", logs)
    check_explained("webhook", [f for f in hook.findings() if f.get("kind") == "oom"][-1])

    tui_shows_it(base, tmp_path)

    gpumon_client.detach()
    wait_until(lambda: (session_of(base, JOB) or {}).get("ended"), 10, "the session's end", logs)
    traces = [str(p) for p in records.iterdir() if p.suffix == ".jsonl"]
    assert len(traces) == 1, traces

    def lines():
        with open(traces[0]) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    wait_until(lambda: lines()[-1:] and lines()[-1]["type"] == "bye", 10, "the trace written up to bye", logs)
    events = [x for x in lines() if x["type"] == "event" and x["kind"] == "oom"]
    assert len(events) == 1 and events[0]["explanation"]["pattern"] == "fragmentation"

    out = subprocess.run([built("gpumon"), "analyze", "--format", "json", traces[0]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    ooms = [x for tr in json.loads(out.stdout)["traces"] for x in tr["findings"] if x["kind"] == "oom"]
    assert ooms, out.stdout
    check_explained("analyze json", ooms[0])
    text = subprocess.run([built("gpumon"), "analyze", traces[0]], capture_output=True, text=True, timeout=60)
    assert "fragmentation" in text.stdout and "oomlib.py:37" in text.stdout and "oomlib.py:32" in text.stdout, text.stdout


def tui_shows_it(base, tmp_path):
    """`gpumon tui --connect` in a real terminal: the Findings screen shows the explained OOM."""
    if shutil.which("tmux") is None:
        if support.REQUIRE_TOOLS:
            pytest.fail("tmux is not installed (GPUMON_REQUIRE_TOOLS=1)", pytrace=False)
        return
    sock = "gpm-%s" % uuid.uuid4().hex[:8]
    config = tmp_path / "empty.toml"
    config.write_text("")
    tmux = ["tmux", "-L", sock]
    env = "env -u TMUX TERM=xterm-256color"
    cmd = "%s %s --config %s tui --connect %s --refresh 200ms" % (env, built("gpumon"), config, base.split("//", 1)[1])
    subprocess.run(tmux + ["new-session", "-d", "-x", "160", "-y", "48", "-s", "t", cmd], check=True)
    try:
        def pane():
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "t"], capture_output=True, text=True).stdout

        deadline = time.monotonic() + 20
        subprocess.run(tmux + ["send-keys", "-t", "t", "3"], check=True)
        while time.monotonic() < deadline and "oomlib.py:37" not in pane():
            time.sleep(0.2)
        screen = pane()
        assert "oomlib.py:37" in screen and "fragmentation" in screen, screen
        subprocess.run(tmux + ["send-keys", "-t", "t", "Enter"], check=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "oomlib.py:32" not in pane():
            time.sleep(0.2)
        assert "oomlib.py:32" in pane(), pane()
        subprocess.run(tmux + ["send-keys", "-t", "t", "q"], check=True)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def test_the_daemon_arms_a_trainer_near_its_cap_and_one_without_cuda_says_so_once(recorded_daemon, caplog):
    """Real torch on CPU cannot record allocation history: asked to arm (its near_limit fires
    under a 4 GiB cap), the client answers `unavailable` from torch itself, logs it once, and the
    daemon does not ask again."""
    import logging

    import gpumon_client.arming as arming
    from gpumon_client import StaticStatsSource

    base, socket_path, logs, _hook, _records = recorded_daemon
    arming._said_unavailable = False
    caplog.set_level(logging.INFO, logger="gpumon_client")
    cap = 4 << 30
    stats = dict(support.STATS, **{"allocated_bytes.all.current": 1 << 30, "allocated_bytes.all.peak": cap - (10 << 20),
                                   "reserved_bytes.all.current": cap - (10 << 20)})
    source = StaticStatsSource(stats, support.MEM_INFO, dict(support.INFO, alloc_limit=cap))
    handle = gpumon_client.attach("arm-e2e", source=source, socket=socket_path, attribution=True, **EXACT)
    assert handle.active and handle.client.armer is not None
    t = Trainer()

    def answered():
        return handle.client.stats()["oom_history"]["answers"]

    deadline = time.monotonic() + 30
    while not answered() and time.monotonic() < deadline:
        t.step()
        time.sleep(0.01)
    assert answered() == {"unavailable": 1}, (answered(), "".join(logs[-20:]))
    near = [f for f in json.loads(get(base + "/api/v1/snapshot")[1])["findings"] if f["kind"] == "near_limit"]
    assert near and near[0]["state"] == "firing", near
    for _ in range(200):  # the pressure goes on: the daemon must not ask again
        t.step()
        time.sleep(0.002)
    assert answered() == {"unavailable": 1}
    assert (session_of(base, "arm-e2e") or {}).get("armed") is None
    said = [r for r in caplog.records if "cannot be kept for OOMs" in r.getMessage()]
    assert len(said) == 1 and "CUDA is not available" in said[0].getMessage()
    gpumon_client.detach()
