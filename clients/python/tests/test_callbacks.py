import sys
import types

import pytest

from gpumon_client import callbacks
from gpumon_client.testing import FakeDaemon


@pytest.fixture
def fake_frameworks(monkeypatch, fake_torch):
    class Callback:
        pass

    class TrainerCallback:
        pass

    lightning = types.ModuleType("lightning")
    pl = types.ModuleType("lightning.pytorch")
    pl.Callback = Callback
    lightning.pytorch = pl
    transformers = types.ModuleType("transformers")
    transformers.TrainerCallback = TrainerCallback
    monkeypatch.setitem(sys.modules, "lightning", lightning)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", pl)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setattr(callbacks, "_built", {})
    return Callback, TrainerCallback


def test_lightning_callback(sock_path, fake_frameworks):
    import gpumon_client

    base = fake_frameworks[0]
    with FakeDaemon(sock_path) as d:
        cb = gpumon_client.LightningCallback("pl-job", socket=sock_path)
        assert isinstance(cb, base)
        trainer = types.SimpleNamespace(global_step=0)
        for step in (1, 1, 2):  # gradient accumulation repeats a global step
            trainer.global_step = step
            cb.on_train_batch_end(trainer, None, None, None, 0)
        cb.on_validation_start(trainer, None)
        cb.on_validation_end(trainer, None)
        trainer.global_step = 3
        cb.on_train_batch_end(trainer, None, None, None, 0)
        cb.on_fit_end(trainer, None)
        msgs = d.wait_for(1, type="bye")
        assert msgs[0]["job"] == "pl-job"
        got = [(m["type"], m.get("step"), m.get("phase")) for m in msgs[1:]]
        assert got == [("sample", 1, "train"), ("sample", 2, "train"), ("event", None, "eval"),
                       ("event", None, "train"), ("sample", 3, "train"), ("bye", None, None)]


def test_hf_callback(sock_path, fake_frameworks):
    base = fake_frameworks[1]
    with FakeDaemon(sock_path) as d:
        cb = callbacks.HFCallback(socket=sock_path)
        assert isinstance(cb, base)
        state = types.SimpleNamespace(global_step=1)
        cb.on_step_end(None, state, None)
        cb.on_prediction_step(None, state, None)
        cb.on_prediction_step(None, state, None)
        cb.on_evaluate(None, state, None, metrics={})
        state.global_step = 2
        cb.on_step_end(None, state, None)
        cb.on_train_end(None, state, None)
        msgs = d.wait_for(1, type="bye")
        got = [(m["type"], m.get("step"), m.get("phase")) for m in msgs[1:]]
        assert got == [("sample", 1, "train"), ("event", None, "eval"), ("event", None, "train"),
                       ("sample", 2, "train"), ("bye", None, None)]


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
