"""alloc_conf in the hello: the allocator settings the trainer runs with, read at attach, so that
the daemon's cache_growth hint can name them (docs/protocol.md)."""

import pytest

from gpumon_client import Client, StaticStatsSource, _env
from gpumon_client.testing import FakeDaemon

import sample_stats

CONF = "max_split_size_mb:128,expandable_segments:True"


@pytest.mark.parametrize("env, want", [
    ({}, None),
    ({"PYTORCH_CUDA_ALLOC_CONF": CONF}, CONF),
    ({"PYTORCH_CUDA_ALLOC_CONF": ""}, ""),
    ({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}, "backend:cudaMallocAsync"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"}, "a:1"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "é" * 100}, "é" * 64),  # cut to 128 bytes, whole characters
])
def test_alloc_conf_from_the_environment(env, want):
    assert _env.alloc_conf(env) == want


def test_the_hello_carries_the_settings_read_at_attach(sock_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", CONF)
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=src, socket=sock_path)
        # Changed after attach: torch has read it already, and so has the client.
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
        c.sample(step=1)
        hello, _ = d.wait_for(2)
        assert hello["alloc_conf"] == CONF
        c.close()


def test_no_setting_sends_no_field(sock_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=src, socket=sock_path)
        c.sample(step=1)
        hello, _ = d.wait_for(2)
        assert "alloc_conf" not in hello
        c.close()
