"""End to end: where the memory goes, from a real torch training loop (CPU) through the real
client and the real daemon to every output: the API session's split and largest safe batch, the
near_limit finding's message and sized remedies, the webhook, /metrics, the recorded trace and
`gpumon analyze` of it. The allocator's figures come from a stats source (CPU torch has no
caching allocator); the split itself is measured on the real tensors."""

import json
import math
import time
import subprocess

import pytest

import support

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client.stats import StaticStatsSource  # noqa: E402
from test_attribution_torch import recorded_daemon  # noqa: E402,F401 (a fixture)
from test_daemon_e2e_torch import built, get, session_of, wait_until  # noqa: E402

_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
JOB = "split-e2e"
BATCH = 64
WIDTH = 512
EXACT = {"max_rate": None, "budget": None}
MEM_INFO = (60 << 30, 80 << 30)


@pytest.fixture(autouse=True)
def measured(monkeypatch):
    monkeypatch.delenv("GPUMON_CATEGORIES", raising=False)


def model():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def saved_bytes(m):
    """What autograd saves in one forward at BATCH (parameters excluded), storages once: the
    activations the client should report, measured here with torch's own hook."""
    params = {p.data_ptr() for p in m.parameters()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[t.data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(torch.randn(BATCH, WIDTH)).pow(2).mean()
    return sum(seen.values())


class Tight(StaticStatsSource):
    """The allocator's figures of a trainer at its cap from step `tight_from` on: the peak is the
    model's own bytes plus activations plus a quarter more of temporaries, 4% under the cap."""

    def __init__(self, peak, cap):
        super().__init__(
            stats={}, mem_info=MEM_INFO, info={"cuda_device": 0, "alloc_limit": cap}, tensor_device="cpu")
        self.peak, self.step = peak, 0

    def memory_stats(self):
        peak = self.peak if self.step >= 4 else self.peak // 2
        return {
            "allocated_bytes.all.current": peak // 3,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": peak + (1 << 20),
            "inactive_split_bytes.all.current": 0,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }


def expected_largest(split, limit):
    """docs/categories.md, computed apart from the daemon: what does not scale stays, the
    activations and temporaries scale with the batch; the margin is a twentieth of the limit, or
    near_limit's (512 MiB, at most a tenth of the cap: here the limit is the cap) when more."""
    act, other, batch, peak = (split["activations_bytes"], split["other_bytes"], split["batch_size"],
                               split["peak_bytes"])
    per_sample = act / batch * (1 + other / act)
    fixed = peak - per_sample * batch
    margin = max(limit // 20, min(512 << 20, limit // 10))
    return max(0, math.floor((limit - margin - fixed) / per_sample))


def test_the_split_and_the_batch_that_fits_reach_every_output(recorded_daemon):
    base, socket_path, logs, hook, records = recorded_daemon
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    param_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    act = saved_bytes(m)
    peak = 4 * param_bytes + act + act // 4
    cap = int(peak * 1.04)
    source = Tight(peak, cap)
    handle = gpumon_client.attach(JOB, source=source, socket=socket_path, world_size=4, rank=0, **EXACT)
    assert handle.active
    for i in range(12):
        source.step = i
        opt.zero_grad(set_to_none=True)
        m(torch.randn(BATCH, WIDTH)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.1)  # the client writes what it buffered on later steps, not at once

    def near():
        status, body = get(base + "/api/v1/snapshot")
        found = [f for f in json.loads(body).get("findings") or []
                 if f["kind"] == "near_limit" and f["state"] == "firing" and f.get("job") == JOB]
        return found[0] if found and "where the memory went" in found[0]["message"] else None

    finding = wait_until(near, 15, "a near_limit finding with the split", logs)
    s = session_of(base, JOB)
    split = s["categories"]
    # Measured on the real tensors: parameters and gradients exactly, AdamW's two moments (and
    # its step counters), the batch, and what autograd saved.
    assert split["step"] == 3 and split["batch_size"] == BATCH, split
    assert split["parameters_bytes"] == param_bytes == split["gradients_bytes"], split
    assert 2 * param_bytes <= split["optimizer_state_bytes"] < 2 * param_bytes + 4096, split
    if _TORCH >= (2, 8):  # older torch saves differently around the loss (test_categories_torch)
        assert abs(split["activations_bytes"] - act) <= 0.03 * act, (split, act)
    else:
        assert split["activations_bytes"] > 0, split
    named = sum(split[k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes",
                                   "buffers_bytes", "activations_bytes"))
    assert split["peak_bytes"] == peak // 2 or split["peak_bytes"] == peak, split
    assert split["other_bytes"] == max(0, split["peak_bytes"] - named), split

    want = expected_largest(split, cap)
    assert abs(s["largest_safe_batch"] - want) <= 1, (s["largest_safe_batch"], want, s["batch_fit"])
    assert s["batch_fit"]["basis"] == "proportional" and s["batch_fit"]["limit_bytes"] == cap, s["batch_fit"]
    fits = s["largest_safe_batch"]
    hint = finding["hint"]
    assert "a batch of %s fits (now %d;" % (fits, BATCH) in hint or "up to %s fits" % fits in hint, hint
    assert "activation checkpointing frees up to" in hint and "over the job's 4 ranks" in hint, hint
    assert finding["evidence"]["categories"]["largest_safe_batch"] == fits, finding["evidence"]
    # An fp32 model: all of its parameters and gradients are float32, and bf16 would halve them.
    assert split["fp32_bytes"] == 2 * param_bytes, split
    assert finding["evidence"]["categories"]["remedies"]["bf16_bytes"] == param_bytes, finding["evidence"]
    assert "bf16 parameters and gradients free" in hint, hint

    wait_until(lambda: [f for f in hook.findings() if f.get("kind") == "near_limit"
                        and "where the memory went" in (f.get("message") or "")], 15, "the webhook's near_limit", logs)

    status, metrics = get(base + "/metrics")
    assert status == 200
    series = [line for line in metrics.splitlines() if line.startswith("gpumon_trainer_memory_bytes{")]
    if series:  # the family is encoded by the metrics output (docs/metrics.md)
        assert any('category="activations"' in line for line in series), series

    gpumon_client.detach()
    wait_until(lambda: (session_of(base, JOB) or {}).get("ended"), 10, "the session's end", logs)
    traces = [str(p) for p in records.iterdir() if p.suffix == ".jsonl"]
    assert len(traces) == 1, traces

    def carried():
        with open(traces[0]) as f:
            return [json.loads(line) for line in f if line.endswith("\n") and '"categories"' in line]
    wait_until(carried, 10, "the split in the trace", logs)
    text = subprocess.run([built("gpumon"), "analyze", traces[0]], capture_output=True, text=True, timeout=60)
    assert "where the memory went" in text.stdout and "activation checkpointing frees" in text.stdout, text.stdout
