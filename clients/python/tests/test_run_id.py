"""run_id and restart in the hello: the daemon groups the ranks of one run into a job by them
(docs/jobs.md), so every rank of a run must say the same run_id, from whichever launcher ran it."""

import os

import pytest

from gpumon_client import Client, StaticStatsSource, _env, protocol
from gpumon_client.testing import FakeDaemon

import sample_stats

LAUNCHER_VARS = ("GPUMON_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


@pytest.mark.parametrize("env, want", [
    ({}, None),
    ({"GPUMON_RUN_ID": "given"}, "given"),
    ({"TORCHELASTIC_RUN_ID": "te-1"}, "te-1"),
    ({"SLURM_JOB_ID": "4242"}, "4242"),
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}, "4242.3"),
    ({"MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}, "node-a:29500"),
    # Half a rendezvous address says nothing about the run.
    ({"MASTER_ADDR": "node-a"}, None),
    ({"MASTER_PORT": "29500"}, None),
    # Precedence: ours, then torchrun's, then Slurm's, then the rendezvous address.
    ({"GPUMON_RUN_ID": "g", "TORCHELASTIC_RUN_ID": "t", "SLURM_JOB_ID": "s"}, "g"),
    ({"TORCHELASTIC_RUN_ID": "t", "SLURM_JOB_ID": "s", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "t"),
    ({"SLURM_JOB_ID": "s", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "s"),
    # Empty is unset.
    ({"GPUMON_RUN_ID": "", "TORCHELASTIC_RUN_ID": "  ", "SLURM_JOB_ID": "s"}, "s"),
])
def test_run_id_comes_from_the_launcher(env, want):
    assert _env.run_id(env) == want


def test_a_long_run_id_is_cut_on_a_character_boundary():
    long = "é" * 100  # 200 bytes
    got = _env.run_id({"GPUMON_RUN_ID": long})
    assert got is not None
    assert len(got.encode("utf-8")) <= _env.RUN_ID_MAX_BYTES
    assert got == "é" * 64
    assert _env.clip_run_id("short") == "short"


@pytest.mark.parametrize("value, want", [("2", 2), ("0", 0), ("-1", None), ("x", None), ("", None)])
def test_restart_count_is_a_whole_number_or_nothing(value, want):
    assert _env.restart_count({"TORCHELASTIC_RESTART_COUNT": value}) == want
    assert _env.restart_count({}) is None


def _clean(monkeypatch):
    for v in LAUNCHER_VARS:
        monkeypatch.delenv(v, raising=False)


def test_the_hello_carries_the_run_and_the_restart(sock_path, monkeypatch):
    _clean(monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "te-run")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=src, socket=sock_path, rank=1, world_size=2)
        c.sample(step=1)
        hello, _ = d.wait_for(2)
        assert hello["run_id"] == "te-run"
        assert hello["restart"] == 1
        c.close()


def test_an_explicit_run_id_wins_and_none_sends_nothing(sock_path, monkeypatch):
    _clean(monkeypatch)
    monkeypatch.setenv("GPUMON_RUN_ID", "from-env")
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=src, socket=sock_path, run_id="given")
        c.sample(step=1)
        hello, _ = d.wait_for(2)
        assert hello["run_id"] == "given"
        c.close()
    _clean(monkeypatch)
    assert "run_id" not in protocol.hello(pid=os.getpid(), job="j")
    assert Client("job-b", source=src, socket=sock_path).run_id is None
