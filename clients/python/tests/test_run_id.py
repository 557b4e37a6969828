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
    # torchrun's default run id for static multi-node runs (--master-addr/--master-port) is
    # "none", the same for every run: unset, so Slurm's job id or the rendezvous address is used.
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "4242"}, "4242"),
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}, "node-a:29500"),
    ({"GPUMON_RUN_ID": "None", "TORCHELASTIC_RUN_ID": "none"}, None),
])
def test_run_id_comes_from_the_launcher(env, want):
    assert _env.run_id(env) == want


@pytest.mark.parametrize("given", ["none", "", "  ", "NONE"])
def test_an_explicit_run_id_of_none_falls_through_to_the_launcher(given, monkeypatch):
    _clean(monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    assert Client("j", source=src, socket="/nonexistent", run_id=given).run_id == "77"


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


def test_a_blank_or_non_str_explicit_run_id(monkeypatch):
    # Blank counts as unset, like the environment's; an int (a Slurm job id) is taken as its str.
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    assert Client("j", source=src, socket="/nonexistent", run_id="  ").run_id == "9"
    assert Client("j", source=src, socket="/nonexistent", run_id=4242).run_id == "4242"  # type: ignore[arg-type]
    assert Client("j", source=src, socket="/nonexistent", run_id=" r ").run_id == "r"
    long = Client("j", source=src, socket="/nonexistent", run_id="x" * 300).run_id
    assert long == "x" * _env.RUN_ID_MAX_BYTES


def test_bytes_that_were_not_utf8_are_dropped_not_raised_on():
    # os.environ hands undecodable bytes over as lone surrogates, which UTF-8 cannot encode.
    assert _env.run_id({"GPUMON_RUN_ID": "run-\udcff1"}) == "run-1"
    assert _env.clip_run_id("\udcff") == ""


def test_an_unset_restart_sends_no_restart(sock_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "soon")
    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=src, socket=sock_path)
        c.sample(step=1)
        hello, _ = d.wait_for(2)
        assert "restart" not in hello and "run_id" not in hello
        c.close()


def test_callbacks_and_reporter_pass_run_id_through(sock_path):
    from gpumon_client import Reporter, callbacks

    src = StaticStatsSource(sample_stats.STATS, (100, 200), {})
    core = callbacks._Core()
    core._gpumon_init("job-a", run_id="cb-run", source=src, socket=sock_path)
    assert core.reporter.client.run_id == "cb-run"
    r = Reporter("job-a", source=src, socket=sock_path, run_id="rep-run")
    assert r.client.run_id == "rep-run"


def _fake_torch(monkeypatch):
    # Just enough torch for attach() to install its step hook, with no CUDA behind it.
    import sys
    import types

    class Handle:
        def remove(self):
            pass

    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    torch._C = types.SimpleNamespace()
    optim = types.ModuleType("torch.optim")
    optimizer = types.ModuleType("torch.optim.optimizer")
    optimizer.register_optimizer_step_post_hook = lambda hook: Handle()
    torch.optim = optim
    optim.optimizer = optimizer
    for name, mod in (("torch", torch), ("torch.optim", optim), ("torch.optim.optimizer", optimizer)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_attach_passes_run_id_to_the_hello(sock_path, monkeypatch):
    import gpumon_client
    from gpumon_client.testing import use_source

    _fake_torch(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "node-a")
    monkeypatch.setenv("MASTER_PORT", "29500")
    use_source(StaticStatsSource(sample_stats.STATS, (100, 200), {}))
    try:
        with FakeDaemon(sock_path) as d:
            a = gpumon_client.attach(job="job-a", socket=sock_path, oom=False, run_id="attached")
            assert a.client is not None, a.reason
            a.client.sample(step=1)
            hello, _ = d.wait_for(2)
            assert hello["run_id"] == "attached"
            gpumon_client.detach(timeout=0.5)
    finally:
        use_source(None)


def test_the_cli_takes_a_run_id():
    from gpumon_client.__main__ import USAGE, _parse

    assert _parse(["run", "--run-id", "r-1", "t.py"])["run_id"] == "r-1"
    assert _parse(["run", "t.py"])["run_id"] is None
    assert "--run-id ID" in USAGE


def test_fixtures_are_the_same_under_a_launcher(monkeypatch):
    # The golden fixtures carry no run_id: generated under srun or torchrun they must not gain one
    # (nor rank, world_size or restart from the launcher), so the Rust side's fixtures stay put.
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "gen_protocol_fixtures", os.path.join(here, "..", "scripts", "gen_protocol_fixtures.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    clean = gen.generate()
    for name, value in (("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "0"), ("TORCHELASTIC_RUN_ID", "te"),
                        ("MASTER_ADDR", "h"), ("MASTER_PORT", "1"), ("TORCHELASTIC_RESTART_COUNT", "2"),
                        ("RANK", "3"), ("WORLD_SIZE", "4")):
        monkeypatch.setenv(name, value)
    assert gen.generate() == clean
    assert os.environ["SLURM_JOB_ID"] == "77"  # put back after generating
    assert not any(b'"run_id"' in v or b'"restart"' in v for v in clean.values())
