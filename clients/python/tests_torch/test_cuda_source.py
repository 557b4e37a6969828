"""TorchStatsSource on real torch, with only the CUDA driver's answers stood in (no GPU here):
the module layout, torch's own memory_stats() flattening, get_per_process_memory_fraction or its
absence, and set_per_process_memory_fraction are the real ones of the installed torch."""

import importlib

import pytest
import support

from gpumon_client import protocol
from gpumon_client.stats import TorchStatsSource, _fractions
from gpumon_client.testing import nested_allocator_stats

torch = support.require("torch")
memory = importlib.import_module("torch.cuda.memory")
TOTAL = 85520809984


class FakeUUID:
    """What torch's _CUDAuuid gives: raw bytes, and a str() without NVML's "GPU-" prefix."""

    bytes = bytes(range(0x10, 0x20))

    def __str__(self):
        h = self.bytes.hex()
        return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


class Props:
    name = "NVIDIA H100 80GB HBM3"
    uuid = FakeUUID()


@pytest.fixture
def cuda(monkeypatch):
    """The CUDA answers a device would give, patched where torch looks them up."""
    nested = nested_allocator_stats(allocated=21 << 30, reserved=30 << 30, retries=4)
    monkeypatch.setattr(memory, "memory_stats_as_nested_dict", lambda device=None: nested)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: nested, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (47244640256, TOTAL))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)
    _fractions.clear()
    return nested


def test_known_keys_match_torchs_own_memory_stats(cuda):
    # torch.cuda.memory_stats() flattens the nested dict in Python: it is the oracle here.
    flat = torch.cuda.memory_stats(0)
    picked = TorchStatsSource(0).memory_stats()
    assert picked == {k: flat[k] for k in protocol.KNOWN_STATS_KEYS}
    assert picked["num_alloc_retries"] == 4 and picked["allocated_bytes.all.current"] == 21 << 30


def test_all_keys_when_asked(cuda):
    assert dict(TorchStatsSource(0, keys=None).memory_stats()) == dict(torch.cuda.memory_stats(0))


def test_counters_missing_on_older_torch_are_left_out(cuda):
    for key in ("num_sync_all_streams", "num_device_alloc", "num_device_free", "requested_bytes"):
        del cuda[key]
    picked = TorchStatsSource(0).memory_stats()
    assert "num_device_free" not in picked and "requested_bytes.all.current" not in picked
    assert picked["reserved_bytes.all.current"] == 30 << 30


def test_device_info_is_the_hello(cuda, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    info = TorchStatsSource().device_info()
    assert info["cuda_device"] == 1  # the current device at first use, not at construction
    assert info["gpu_uuid"] == "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"
    assert info["torch"] == torch.__version__ and info["allocator"] == "native"
    assert info["expandable_segments"] is True and info["alloc_limit"] is None


def test_alloc_limit_from_the_fraction(cuda, monkeypatch):
    source = TorchStatsSource(0)
    if hasattr(memory, "get_per_process_memory_fraction"):
        fraction = {"value": 1.0}
        monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: fraction["value"])
        assert source.alloc_limit() is None
        fraction["value"] = 0.0594
    else:
        # No getter on this torch: the client records what set_per_process_memory_fraction is given.
        calls = []
        real = memory.set_per_process_memory_fraction
        monkeypatch.setattr(memory, "set_per_process_memory_fraction", lambda f, device=None: calls.append((f, device)))
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", memory.set_per_process_memory_fraction)
        source._mod()  # first use wraps the setter
        assert torch.cuda.set_per_process_memory_fraction is not real
        assert source.alloc_limit() is None
        torch.cuda.set_per_process_memory_fraction(0.0594, 0)
        assert calls == [(0.0594, 0)]
    assert source.alloc_limit() == int(0.0594 * TOTAL)


def test_a_device_without_uuid_is_one_warning(cuda, monkeypatch, caplog):
    class OldProps:
        name = "NVIDIA A100"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: OldProps())
    monkeypatch.setattr("gpumon_client.stats._warned_uuid", False)
    with caplog.at_level("WARNING", logger="gpumon_client"):
        assert "gpu_uuid" not in TorchStatsSource(0).device_info()
        assert "gpu_uuid" not in TorchStatsSource(0).device_info()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and ("torch %s does not report the device UUID" % torch.__version__) in warnings[0]
