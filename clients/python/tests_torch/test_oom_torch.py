"""The OOM observer registered with the real torch._C._cuda_attach_out_of_memory_observer."""

import json
import os

import pytest

import support
from support import of_type, train_step

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client import oomreport  # noqa: E402
from gpumon_client.snapshot import load as snapload  # noqa: E402

FIXTURES = os.path.join(support.REPO_ROOT, "tests", "fixtures", "torch-oom")

REAL_ATTACH = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
pytestmark = pytest.mark.skipif(REAL_ATTACH is None, reason="this torch build has no CUDA allocator (CPU-only wheel)")


def run_cuda_init_callbacks(start):
    support.run_cuda_init_callbacks(torch, start)


@pytest.fixture
def registered(monkeypatch):
    return support.capture_oom_observers(torch, monkeypatch)


def test_the_real_registration_does_not_raise_into_the_trainer(ingest, source, registered):
    handed, raised = registered
    queued = len(torch.cuda._queued_calls)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = gpumon_client.attach("oom", source=source, socket=ingest.path, oom=True, max_rate=None, budget=None)
    assert handle.active
    train_step(torch, model, [opt], seed=0)
    run_cuda_init_callbacks(queued)  # as if the trainer had now initialised CUDA
    train_step(torch, model, [opt], seed=1)
    assert len(handed) >= 1 and all(fn is handed[0] for fn in handed)
    if not torch.cuda.is_available():
        assert raised, "torch accepted an OOM observer without a GPU: this test no longer covers the failure"
    gpumon_client.detach()
    msgs = ingest.messages()
    if ingest.up:
        assert [m["step"] for m in of_type(msgs, "sample")] == [1, 2]
        assert msgs[-1]["type"] == "bye"


def test_observer_called_like_torch_calls_it_sends_an_oom_event(ingest, source, registered):
    handed, _ = registered
    queued = len(torch.cuda._queued_calls)
    handle = gpumon_client.attach("oom", source=source, socket=ingest.path, oom=True, max_rate=None, budget=None)
    assert handle.active
    run_cuda_init_callbacks(queued)
    if not handed:  # a client that installs at the first optimizer step instead
        model = torch.nn.Linear(8, 1)
        train_step(torch, model, [torch.optim.SGD(model.parameters(), lr=0.1)], seed=0)
    assert handed, "the client never gave torch an OOM observer"
    # c10/cuda/CUDACachingAllocator.cpp: observer(device, alloc_size, limit, device_free), where
    # limit is the set_per_process_memory_fraction cap, else the device total.
    device, alloc, limit, free = 1, 2 << 30, 40 << 30, 100 << 20
    handed[0](device, alloc, limit, free)
    gpumon_client.detach()
    msgs = ingest.messages()
    if not ingest.up:
        return
    events = [m for m in of_type(msgs, "event") if m["kind"] == "oom"]
    assert len(events) == 1
    oom = events[0]
    assert (oom["alloc_bytes"], oom["device_free"], oom["alloc_limit"]) == (alloc, free, limit)
    assert "2.00 GiB" in oom["detail"] and "device 1" in oom["detail"] and "40.00 GiB" in oom["detail"]
    assert isinstance(oom["ts"], float)
    # Real torch's _snapshot() here, with no GPU, holds no segments: the explanation says so
    # rather than guessing a pattern.
    ex = oom["explanation"]
    assert ex["pattern"] == "unknown" and ex["request_bytes"] == alloc and ex["limit_bytes"] == limit
    assert "no memory segments" in ex["reasons"][0]


def observed_oom(ingest, source, registered, device, alloc, limit, free):
    """Attaches, fires the observer the client handed torch as the allocator would, and returns
    the oom event the daemon stand-in received (None when nothing listens)."""
    handed, _ = registered
    queued = len(torch.cuda._queued_calls)
    handle = gpumon_client.attach("oom", source=source, socket=ingest.path, oom=True, max_rate=None, budget=None)
    assert handle.active
    run_cuda_init_callbacks(queued)
    if not handed:
        model = torch.nn.Linear(8, 1)
        train_step(torch, model, [torch.optim.SGD(model.parameters(), lr=0.1)], seed=0)
    handed[0](device, alloc, limit, free)
    gpumon_client.detach()
    if not ingest.up:
        return None  # nobody listening: the observer still ran, and must not have raised
    events = [m for m in of_type(ingest.messages(), "event") if m["kind"] == "oom"]
    assert len(events) == 1
    return events[0]


@pytest.mark.parametrize("case", ["pressure", "fragmentation", "leak"])
def test_the_observer_explains_the_oom_from_the_snapshot_it_takes(ingest, source, registered, monkeypatch, case):
    # Only torch.cuda.memory._snapshot() is stood in (no GPU here): by the real H100 snapshot
    # taken at that OOM. Everything else is the client's real path inside torch's callback.
    import torch.cuda.memory as memory

    meta = json.load(open(os.path.join(FIXTURES, case + ".json")))
    snap = snapload.load(os.path.join(FIXTURES, case + ".pickle"))
    calls = []
    monkeypatch.setattr(memory, "_snapshot", lambda *a, **k: calls.append(1) or snap)
    request = [e for e in snap["device_traces"][0] if e["action"] == "oom"][-1]["size"]
    oom = observed_oom(ingest, source, registered, 0, request, meta["cap_bytes"], 70 << 30)
    assert calls == [1]
    if oom is None:
        return
    ex = oom["explanation"]
    assert ex["pattern"] == meta["pattern"] and ex["limit_bytes"] == meta["cap_bytes"] and ex["history"]
    want = meta["expect"]
    if "failing_site" in want:
        got = ex["failing_site"]
        assert (os.path.basename(got["file"]), got["line"]) == (want["failing_site"]["file"], want["failing_site"]["line"])
    if "top_live_site" in want:
        top = ex["live_sites"][0]
        assert (os.path.basename(top["file"]), top["line"]) == (want["top_live_site"]["file"], want["top_live_site"]["line"])
    assert len(json.dumps(oom)) < 65536 and oomreport.last_seconds < 5


def test_observer_without_an_attachment_is_harmless(source, registered, sock_dir):
    # torch keeps the observer for the life of the process; after detach() it must do nothing.
    handed, _ = registered
    queued = len(torch.cuda._queued_calls)
    gpumon_client.attach("oom", source=source, socket=sock_dir + "/absent.sock", oom=True)
    run_cuda_init_callbacks(queued)
    gpumon_client.detach()
    assert handed
    handed[0](0, 1 << 20, 1 << 30, 0)
