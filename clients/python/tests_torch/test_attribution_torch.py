"""Leak attribution with real torch on CPU: a real SGD loop attached with gpumon_client.attach().

There is no CUDA here, so torch.cuda.memory._record_memory_history cannot run: the default
source must say so (`unavailable`) and training goes on; with ReplaySnapshotSource the windows
replay the H100 snapshots of a trainer that keeps every step's output (train.py:27). The last
test runs against the real daemon binary, whose leak detector asks for the window itself."""

import json
import os
import time

import pytest

import support

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client import StaticStatsSource, testing  # noqa: E402
from gpumon_client.testing import FakeDaemon  # noqa: E402
from test_daemon_e2e_torch import built, run_daemon, session_of, wait_until, get  # noqa: E402

SNAPS = os.path.join(support.REPO_ROOT, "tests", "fixtures", "torch-snapshots")
BEFORE = os.path.join(SNAPS, "leak-kept-outputs-step60.pickle")
AFTER = os.path.join(SNAPS, "leak-kept-outputs-step180.pickle")
MIB = 1 << 20
# Every training step is sampled and written at once: requests are read at writes, and these
# tests name the step a request is read at.
EXACT = {"max_rate": None, "budget": None, "write_every": 0}


@pytest.fixture(autouse=True)
def no_injected_snapshots():
    # One thread: the model is tiny, and on a busy machine torch's thread pool makes a step
    # ten times slower, which only lengthens the end-to-end test.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    testing.use_snapshots(None)


class Trainer:
    """A small real model trained with SGD; `step()` is one optimizer step (attach() samples it)."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(64, 16, generator=gen)
        self.y = self.x[:, :1] * 2.0 - 1.0
        self.losses = []

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        self.losses.append(loss.detach().item())


def wait_readable(handle, timeout=3.0):
    import select

    sock = handle.client.transport._sock
    assert sock is not None and select.select([sock], [], [], timeout)[0], "the request did not arrive"


def connected_daemon(sock_dir):
    path = os.path.join(sock_dir, "ingest.sock")
    return path, FakeDaemon(path).start()


def attributions(d, n=1):
    return [m for m in d.wait_for(n, type="attribution") if m["type"] == "attribution"]


def test_without_cuda_the_trainer_answers_unavailable_and_trains_on(sock_dir, source):
    path, d = connected_daemon(sock_dir)
    try:
        t = Trainer()
        handle = gpumon_client.attach("no-cuda", source=source, socket=path, attribution=True, **EXACT)
        assert handle.active
        for _ in range(3):
            t.step()
        hello = d.wait_for(1, type="hello")[0]
        assert hello["caps"] == ["attribution", "oom_history", "ack"]
        while handle.client.stats()["session"] is None:
            time.sleep(0.001)
        d.attribute(id=1, steps=20)
        wait_readable(handle)
        for _ in range(30):
            t.step()
        (a,) = attributions(d)
        assert (a["id"], a["error"]) == (1, "unavailable")
        assert a["detail"] == "CUDA is not available to torch %s; allocation history needs a CUDA device" % torch.__version__
        assert t.losses[-1] < t.losses[0] / 2  # training went on, and learned
        gpumon_client.detach()
        msgs = d.wait_for(1, type="bye")
        assert [m["step"] for m in msgs if m["type"] == "sample"] == list(range(1, 34))
        stats = handle.client.stats()
        assert stats["attribution"]["answers"] == {"unavailable": 1} and stats["internal_errors"] == 0
    finally:
        d.stop()


def test_replayed_snapshots_name_the_kept_outputs_line(sock_dir, source):
    replay = testing.use_snapshots(BEFORE, AFTER)
    path, d = connected_daemon(sock_dir)
    try:
        t = Trainer()
        handle = gpumon_client.attach("replay", source=source, socket=path, **EXACT)
        t.step()
        assert d.wait_for(1, type="hello")[0]["caps"] == ["attribution", "oom_history", "ack"]
        while handle.client.stats()["session"] is None:
            time.sleep(0.001)
        d.attribute(id=5, steps=10, top=3)
        wait_readable(handle)
        for _ in range(15):
            t.step()
        (a,) = attributions(d)
        assert (a["id"], a["step_from"], a["step_to"]) == (5, 3, 13)  # request read at step 2's sample
        top = a["sites"][0]
        assert (os.path.basename(top["file"]), top["line"], top["function"]) == ("train.py", 27, "kept_outputs")
        assert top["bytes"] == 120 * MIB and a["total_growth_bytes"] == 120 * MIB
        assert [c[0] for c in replay.calls] == ["start", "snapshot", "snapshot", "stop"] and not replay.recording
        gpumon_client.detach()
    finally:
        d.stop()


class GrowingSource(StaticStatsSource):
    """The injected allocator numbers of a leaking trainer: the step floor grows `leak` bytes a
    step (the real torch loop runs on CPU; only these numbers stand in for the GPU's)."""

    def __init__(self, leak):
        super().__init__(dict(support.STATS), support.MEM_INFO, dict(support.INFO))
        self.leak = leak
        self.step = 0

    def memory_stats(self):
        allocated = (1 << 30) + self.step * self.leak
        return dict(self.stats, **{
            "allocated_bytes.all.current": allocated,
            "active_bytes.all.current": allocated,
            "requested_bytes.all.current": allocated - 4096,
            "allocated_bytes.all.peak": allocated + (256 << 20),
            "reserved_bytes.all.current": allocated + (1 << 30),
        })


class Webhook:
    """A real HTTP server on loopback that keeps the JSON bodies the daemon's webhook sink posts."""

    def __init__(self):
        import http.server
        import threading

        bodies = self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/gpumon" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def findings(self):
        """Every finding posted so far, whatever the body's envelope."""
        out = []

        def walk(v):
            if isinstance(v, dict):
                if "kind" in v and "message" in v:
                    out.append(v)
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)

        walk(self.bodies)
        return out


@pytest.fixture
def recorded_daemon(sock_dir, tmp_path):
    hook = Webhook()
    records = tmp_path / "traces"
    records.mkdir()
    try:
        for base, socket_path, logs in run_daemon(
                sock_dir, ["--record-dir", str(records), "--webhook-url", hook.url]):
            yield base, socket_path, logs, hook, records
    finally:
        hook.server.shutdown()


def test_the_real_daemon_asks_and_shows_the_attributed_line(recorded_daemon):
    """daemon asks → client records (replayed snapshots) → attribution arrives → the line shows in
    the API, the webhook body, the recorded trace and `gpumon analyze` of that trace."""
    base, socket_path, logs, hook, records = recorded_daemon
    replay = testing.use_snapshots(BEFORE, AFTER)
    source = GrowingSource(8 * MIB)
    t = Trainer()
    handle = gpumon_client.attach("attr-e2e", source=source, socket=socket_path, **EXACT)
    assert handle.active

    def leak_finding():
        status, body = get(base + "/api/v1/snapshot")
        assert status == 200, body
        snap = json.loads(body)
        sessions = [s for s in snap["sessions"] if s.get("job") == "attr-e2e"]
        if not sessions:
            return None
        found = [f for f in snap.get("findings") or [] if f.get("session") == sessions[0]["session"] and f.get("kind") == "leak"]
        return (sessions[0], found[0]) if found else (sessions[0], None)

    attributed = None
    for i in range(1, 2001):
        source.step = i
        t.step()
        time.sleep(0.002)  # under the daemon's 1000 lines a second
        if i % 25 == 0:
            seen = leak_finding()
            if seen and seen[1] and seen[1].get("attribution"):
                attributed = seen
                break
    assert attributed is not None, "no attributed leak finding after %d steps; client %s; daemon logs:\n%s" % (
        i, handle.client.stats(), "".join(logs[-30:]))
    session, finding = attributed
    a = finding["attribution"]
    top = a["sites"][0]
    assert (os.path.basename(top["file"]), top["line"], top["function"]) == ("train.py", 27, "kept_outputs")
    assert top["bytes"] == 120 * MIB and a["total_growth_bytes"] == 120 * MIB
    assert a["id"] == 1 and a["finding"] == finding["id"] and a["step_to"] - a["step_from"] >= 20
    assert finding["state"] in ("pending", "firing")
    assert [c[0] for c in replay.calls] == ["start", "snapshot", "snapshot", "stop"] and not replay.recording
    assert handle.client.stats()["attribution"]["answers"] == {"sites": 1}
    assert "train.py:27" in finding["message"], finding["message"]
    gpumon_client.detach()
    wait_until(lambda: (session_of(base, "attr-e2e") or {}).get("ended"), 10, "the session's end", logs)
    assert session_of(base, "attr-e2e")["attribution"]["sites"][0]["line"] == 27

    # The alert sink saw the site: the finding posted after the answer carries it.
    def posted():
        return [f for f in hook.findings() if f.get("kind") == "leak" and f.get("attribution")]
    wait_until(lambda: posted(), 15, "a webhook post with the attribution", logs)
    assert posted()[-1]["attribution"]["sites"][0]["function"] == "kept_outputs"

    # The recorder kept the answer as received, and analyze replays it onto the leak.
    traces = [str(p) for p in records.iterdir() if p.suffix == ".jsonl"]
    assert len(traces) == 1, traces

    def kinds():
        with open(traces[0]) as f:
            return [json.loads(line)["type"] for line in f if line.endswith("\n")]
    # The recorder's own thread writes the file: wait for the session's bye to reach it.
    wait_until(lambda: kinds()[-1:] == ["bye"], 10, "the trace written up to bye", logs)
    kinds = kinds()
    assert kinds.count("attribution") == 1, kinds
    import subprocess

    out = subprocess.run([built("gpumon"), "analyze", "--format", "json", traces[0]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr  # 1: findings
    leaks = [x for t in json.loads(out.stdout)["traces"] for x in t["findings"] if x["kind"] == "leak"]
    assert leaks and leaks[0]["attribution"]["sites"][0]["line"] == 27, out.stdout
    text = subprocess.run([built("gpumon"), "analyze", traces[0]], capture_output=True, text=True, timeout=60)
    assert "train.py:27" in text.stdout and "kept_outputs" in text.stdout, text.stdout
