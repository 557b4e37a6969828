"""End to end: a real-torch training loop attached to the real gpumon daemon (built by
`cargo build --workspace`, NVML played by the fake library), read back from its JSON API."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

import support
from support import train_step

torch = support.require("torch")

import gpumon_client  # noqa: E402

STEPS = 5


def built(name):
    target = os.path.join(support.REPO_ROOT, os.environ.get("CARGO_TARGET_DIR", "target"))
    return os.path.join(target, "debug", name)


@pytest.fixture
def daemon(sock_dir):
    yield from run_daemon(sock_dir)


def run_daemon(sock_dir, extra_args=(), scenario="two_gpus.toml"):
    """The real daemon on the fake NVML library playing `scenario` (crates/fake-nvml/scenarios):
    yields (base URL, socket path, its log lines)."""
    binary, lib = built("gpumon"), built("libfake_nvml.so")
    missing = [p for p in (binary, lib) if not os.path.exists(p)]
    if missing:
        reason = "%s missing: run `cargo build --workspace`" % ", ".join(missing)
        if support.REQUIRE_TOOLS:
            pytest.fail(reason + " (GPUMON_REQUIRE_TOOLS=1)", pytrace=False)
        pytest.skip(reason)
    config = tempfile.NamedTemporaryFile(suffix=".toml")  # empty: /etc/gpumon must not leak in
    socket_path = os.path.join(sock_dir, "ingest.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env["FAKE_NVML_SCENARIO"] = os.path.join(support.REPO_ROOT, "crates", "fake-nvml", "scenarios", scenario)
    env["GPUMON_LOG_LEVEL"] = "info"
    argv = [binary, "--config", config.name, "--log-format", "json", "daemon", "--listen", "127.0.0.1:0",
            "--nvml-lib", lib, "--socket", socket_path, "--interval", "100ms", *extra_args]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    logs, ready = [], threading.Event()
    listen = []

    def read_logs():
        for line in proc.stderr:
            logs.append(line)
            try:  # the fake library shares stderr: parse from the first brace
                fields = json.loads(line[line.index("{"):]).get("fields", {})
            except ValueError:
                continue
            if fields.get("message") == "gpumon daemon serving":
                listen.append(fields["listen"])
                ready.set()

    threading.Thread(target=read_logs, daemon=True).start()
    try:
        assert ready.wait(20), "daemon did not start: %s" % "".join(logs)
        base = "http://%s" % listen[0]
        wait_until(lambda: get(base + "/readyz")[0] == 200, 10, "first NVML poll", logs)
        yield base, socket_path, logs
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        config.close()


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_until(cond, timeout, what, logs):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for %s; daemon logs:\n%s" % (what, "".join(logs[-30:])))


def session_of(base, job):
    status, body = get(base + "/api/v1/snapshot")
    assert status == 200, body
    found = [s for s in json.loads(body)["sessions"] if s.get("job") == job]
    return found[0] if found else None


def test_real_torch_loop_shows_up_in_the_real_daemon(daemon, source):
    base, socket_path, logs = daemon
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = gpumon_client.attach("e2e", source=source, socket=socket_path, rank=1, world_size=2, max_rate=None, budget=None)
    assert handle.active
    for i in range(STEPS):
        train_step(torch, model, [opt], seed=i)

    # Samples are written together, at most every write_every seconds (0.5): the first goes at
    # once, and what waits when the loop stops goes with the bye.
    def shown():
        s = session_of(base, "e2e")
        return s if s and s.get("samples", 0) >= 1 else None

    s = wait_until(shown, 10, "the session's first sample", logs)
    assert (s["rank"], s["world_size"], s["phase"]) == (1, 2, "train")
    assert (s["pid"], s["ns_pid"], s["gpu_uuid"], s["gpu"]) == (os.getpid(), os.getpid(), support.GPU_UUID, 0)
    assert (s["device_free"], s["device_total"]) == support.MEM_INFO
    assert s["ended"] is None
    assert handle.client.stats()["session"] == s["session"]  # the welcome named this session

    gpumon_client.detach()

    def ended():
        e = session_of(base, "e2e")
        return e if e and e.get("ended") else None

    e = wait_until(ended, 10, "the session's end", logs)
    assert e["ended"][1] == "clean" and (e["samples"], e["step"]) == (STEPS, STEPS)
