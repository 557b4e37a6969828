import os
import shutil
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The package is imported from the source tree, uninstalled, wherever pytest is started.
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import gpumon_client  # noqa: E402
from gpumon_client import _env  # noqa: E402
from gpumon_client import hooks as attach_mod  # noqa: E402
from gpumon_client import phases as phase_mod  # noqa: E402


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    # The launcher's variables too (_env.HELLO_VARS: run_id, restart, rank...), so the tests pass
    # the same under srun or torchrun as on a laptop.
    for name in ("GPUMON_DISABLE", "GPUMON_SOCKET", "PYTORCH_CUDA_ALLOC_CONF") + _env.HELLO_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    gpumon_client.detach(timeout=0.2)
    attach_mod._oom_observer_installed = False
    phase_mod._current = "train"


@pytest.fixture
def sock_path():
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    d = tempfile.mkdtemp(prefix="gpm")
    yield os.path.join(d, "ingest.sock")
    shutil.rmtree(d, ignore_errors=True)
