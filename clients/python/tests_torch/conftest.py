"""Fixtures for the client's tests against real torch (and Lightning, transformers) on CPU.

Run with a Python that has torch: `$(scripts/torch-venv newest)/bin/python -m pytest -q
clients/python/tests_torch`. Without torch (or Lightning, transformers) the affected tests skip,
unless GPUMON_REQUIRE_TORCH=1, which turns every such skip into a failure.
"""

import json
import logging
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional

import pytest

import support

# Nothing here may reach the network: models are built from configs, datasets live in memory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_CLIENT_ENV = ("GPUMON_DISABLE", "GPUMON_SOCKET", "GPUMON_JOB", "GPUMON_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "PYTORCH_CUDA_ALLOC_CONF")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "frameworks: needs Lightning or transformers (absent from the oldest-torch venv)")
    config.addinivalue_line("markers", "torchrun: a two-rank torchrun job (run on the newest torch only, see scripts/check)")


@pytest.fixture(autouse=True)
def clean_client_state(monkeypatch: Any) -> Any:
    """Each test starts with no attachment, no injected source, phase "train" and a clean env."""
    for name in _CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    import gpumon_client
    from gpumon_client import hooks, phases, testing

    gpumon_client.detach(timeout=0.5)
    if hasattr(testing, "use_source"):
        testing.use_source(None)
    if hasattr(testing, "use_snapshots"):
        testing.use_snapshots(None)
    # Process-wide state the client keeps between attach() calls; a test must not inherit it.
    if hasattr(phases, "_current"):
        phases._current = "train"
    if hasattr(hooks, "_oom_observer_installed"):
        hooks._oom_observer_installed = False


@pytest.fixture
def sock_dir() -> Any:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    d = tempfile.mkdtemp(prefix="gpm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Ingest:
    """Where a trainer under test sends: a FakeDaemon, or a socket path nobody listens on."""

    def __init__(self, path: str, daemon: Any) -> None:
        self.path = path
        self.daemon = daemon

    @property
    def up(self) -> bool:
        return self.daemon is not None

    def messages(self, byes: int = 1, timeout: float = 5.0) -> List[Dict[str, Any]]:
        """Every line received, once `byes` sessions ended (bye is each session's last line)."""
        if self.daemon is None:
            return []
        self.daemon.wait_for(byes, type="bye", timeout=timeout)
        return self.daemon.messages()

    def sessions(self, byes: int = 1, timeout: float = 5.0) -> List[List[Dict[str, Any]]]:
        """The lines of each connection, in arrival order."""
        self.messages(byes, timeout)
        if self.daemon is None:
            return []
        return [[json.loads(line) for line in conn.lines] for conn in self.daemon.connections]


@pytest.fixture(params=["daemon", "no_daemon"])
def ingest(request: Any, sock_dir: str, caplog: Any) -> Any:
    """Each test that takes it runs twice: with a FakeDaemon, and with no daemon at the path.
    Either way the client must not complain: its warnings mean an error it swallowed."""
    caplog.set_level(logging.WARNING, logger="gpumon_client")
    if request.param == "no_daemon":
        yield Ingest(os.path.join(sock_dir, "absent.sock"), None)
    else:
        from gpumon_client.testing import FakeDaemon

        path = os.path.join(sock_dir, "ingest.sock")
        with FakeDaemon(path) as daemon:
            yield Ingest(path, daemon)
    complaints = [r.getMessage() for r in caplog.records if r.name.startswith("gpumon_client") and r.levelno >= logging.WARNING]
    assert not complaints, complaints


@pytest.fixture
def source() -> Any:
    return support.make_source()


@pytest.fixture
def child_env(tmp_path: Any) -> Dict[str, str]:
    """The environment of a child Python: the client from the source tree, and a sitecustomize
    that injects the allocator numbers (drop GPUMON_TEST_SOURCE to inject nothing)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(support.SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV and not k.startswith("GPUMON_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), support.CLIENT_ROOT])
    env.update(support.source_env())
    return env


def pytest_report_header(config: Any) -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch: not installed"
    return "torch %s, CUDA available: %s" % (torch.__version__, torch.cuda.is_available())
