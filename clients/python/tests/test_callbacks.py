import sys
import types

import pytest

from gpumon_client import callbacks


@pytest.fixture
def fake_frameworks(monkeypatch):
    # Only the import fallback is tested here; real Lightning and transformers run in tests_torch/.
    monkeypatch.setattr(callbacks, "_built", {})


def test_lightning_old_package_name(monkeypatch, fake_frameworks):
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # import fails
    old = types.ModuleType("pytorch_lightning")

    class OldCallback:
        pass

    old.Callback = OldCallback
    monkeypatch.setitem(sys.modules, "pytorch_lightning", old)
    assert issubclass(callbacks.LightningCallback, OldCallback)


def test_unknown_attribute():
    with pytest.raises(AttributeError):
        callbacks.NoSuchCallback
