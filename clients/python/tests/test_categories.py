"""The memory split without torch: when it is measured (CategoryProbe), how the step path carries
it (attach()'s hook), and its place on the wire. tests_torch/test_categories_torch.py measures it
on real torch."""

import json

import pytest

from gpumon_client import protocol
from gpumon_client.cadence import Cadence
from gpumon_client.categories import FIRST_STEP, INTERVAL, CategoryProbe, Measurement
from gpumon_client.client import Client
from gpumon_client.hooks import Attachment
from gpumon_client.stats import StaticStatsSource, cuda_device_name
from gpumon_client.testing import FakeDaemon

SPLIT_KEYS = ["step", "parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "buffers_bytes",
              "activations_bytes", "batch_size"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeMeasurement:
    """Stands in for categories.Measurement: finish() gives a split, or None (a failure)."""

    def __init__(self, log, armed_at, fail=False, off=None):
        self.log = log
        self.armed_at = armed_at
        self.fail = fail
        self.off = off
        self.stale = False
        self.error = "boom" if fail else None
        self.closed = False

    def finish(self, step, optimizers):
        self.log.append(("finish", self.armed_at, step, list(optimizers)))
        if self.fail:
            return None
        return protocol.categories(step, 100, 100, 200, 8, 50, 32)

    def close(self):
        self.closed = True

    def unstale(self):
        return True


class Starter:
    def __init__(self):
        self.log = []
        self.step = 0  # set by the test: the step the probe is at
        self.fail = False
        self.off = None
        self.made = []

    def __call__(self):
        self.log.append(("arm", self.step))
        m = FakeMeasurement(self.log, self.step, self.fail, self.off)
        self.made.append(m)
        return m


def drive(probe, starter, steps, optimizer="opt"):
    out = {}
    for step in steps:
        starter.step = step
        split = probe.at_step(step, optimizer)
        if split is not None:
            out[step] = split
    return out


def test_the_first_measured_step_is_the_third_then_one_every_five_minutes():
    starter, clock = Starter(), Clock()
    probe = CategoryProbe(starter, clock=clock)
    assert (FIRST_STEP, INTERVAL) == (3, 300.0)
    assert probe.skip_limit(1) == 0  # the hook must look at step 2, which arms step 3
    assert drive(probe, starter, [1]) == {}
    assert probe.measuring is None
    assert drive(probe, starter, [2]) == {} and probe.measuring is not None
    assert probe.skip_limit(2) == 0  # the measured step takes the whole path
    splits = drive(probe, starter, [3])
    assert list(splits) == [3] and list(splits[3]) == SPLIT_KEYS and splits[3]["step"] == 3
    assert probe.measuring is None and probe.skip_limit(3) > 1000
    clock.now += INTERVAL - 1
    assert drive(probe, starter, range(4, 50)) == {}
    clock.now += 1
    assert list(drive(probe, starter, [50, 51, 52])) == [51]
    assert starter.log == [("arm", 2), ("finish", 2, 3, ["opt"]), ("arm", 50), ("finish", 50, 51, ["opt"])]
    assert probe.stats()["measured"] == 2 and probe.last["step"] == 51


def test_a_late_first_look_arms_at_once():
    # The hook's countdown may skip steps: the first whole-path step past step 2 arms.
    starter = Starter()
    probe = CategoryProbe(starter, clock=Clock())
    assert list(drive(probe, starter, [1, 9, 10])) == [10]
    assert starter.log[0] == ("arm", 9)


def test_asked_measures_the_next_step_whatever_the_interval():
    starter, clock = Starter(), Clock()
    probe = CategoryProbe(starter, clock=clock)
    drive(probe, starter, [1, 2, 3])
    probe.ask()
    assert probe.skip_limit(3) == 0
    assert list(drive(probe, starter, [4, 5, 6])) == [5]


def test_failures_are_retried_at_the_interval_and_three_in_a_row_stop_it():
    starter, clock = Starter(), Clock()
    starter.fail = True
    probe = CategoryProbe(starter, clock=clock)
    step = 1
    for _ in range(3):
        assert drive(probe, starter, [step, step + 1, step + 2]) == {}
        step += 3
        clock.now += INTERVAL
    assert probe.stats()["failed"] == 3 and probe.off == "3 measurements in a row failed"
    assert drive(probe, starter, range(step, step + 5)) == {}
    assert [e[0] for e in starter.log].count("arm") == 3


def test_a_measurement_that_cannot_run_turns_it_off_for_the_session():
    starter = Starter()
    starter.off = "torch.compile is in use"
    probe = CategoryProbe(starter, clock=Clock())
    assert drive(probe, starter, range(1, 10)) == {}
    assert probe.off == "torch.compile is in use" and len(starter.made) == 1
    assert probe.skip_limit(10) > 1000


def test_close_disarms():
    starter = Starter()
    probe = CategoryProbe(starter, clock=Clock())
    drive(probe, starter, [1, 2])
    probe.close()
    assert starter.made[0].closed and probe.measuring is None
    assert drive(probe, starter, range(3, 9)) == {}


def test_the_split_on_the_wire():
    split = protocol.categories(7, 1 << 30, 1 << 30, 2 << 30, 4096, 5 << 30, None, partial=["x" * 600, "b"])
    assert list(split) == SPLIT_KEYS + ["partial"]
    assert split["batch_size"] is None and len(split["partial"][0].encode()) == protocol.MAX_STR
    assert "partial" not in protocol.categories(1, 0, 0, 0, 0, 0, 4)
    many = protocol.categories(1, 0, 0, 0, 0, 0, 4, partial=[str(i) for i in range(20)])
    assert len(many["partial"]) == protocol.MAX_PARTIAL
    msg = protocol.sample(1.5, {"allocated_bytes.all.current": 1}, step=7, device_free=1, device_total=2,
                          categories=split)
    assert list(msg)[-1] == "categories"
    line = json.loads(protocol.encode(msg))
    assert line["categories"]["parameters_bytes"] == 1 << 30 and line["categories"]["batch_size"] is None
    assert "categories" not in protocol.sample(1.5, {}, step=7)


def test_fp32_bytes_on_the_wire_after_batch_size_and_only_when_given():
    split = protocol.categories(7, 400, 400, 800, 0, 50, 32, partial=["main_grad: x"], fp32_bytes=600)
    assert list(split) == SPLIT_KEYS + ["fp32_bytes", "partial"]
    assert split["fp32_bytes"] == 600
    assert protocol.categories(7, 400, 400, 800, 0, 50, 32, fp32_bytes=0)["fp32_bytes"] == 0
    assert "fp32_bytes" not in protocol.categories(7, 400, 400, 800, 0, 50, 32)


# --- Measurement._read on an emulated torch: the dtype and storage bookkeeping of fp32_bytes ----


class FakeDevice:
    def __init__(self, type, index=None):
        self.type, self.index = type, index

    def __eq__(self, other):
        return isinstance(other, FakeDevice) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))


class FakeStorage:
    def __init__(self, ptr, nbytes):
        self.ptr, self.n = ptr, nbytes

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.n


class FakeTensor:
    def __init__(self, ptr, nbytes, dtype, device=None, numel=None):
        self._storage = FakeStorage(ptr, nbytes)
        self.dtype = dtype
        self.device = device or FakeDevice("cuda", 0)
        self._numel = nbytes if numel is None else numel
        self.grad = None
        self.requires_grad = True

    def untyped_storage(self):
        return self._storage

    def numel(self):
        return self._numel


class FakeParameter(FakeTensor):
    pass


class FakeModule:
    def __init__(self, params=(), buffers=()):
        self._parameters = {str(i): p for i, p in enumerate(params)}
        self._buffers = {str(i): b for i, b in enumerate(buffers)}

    def modules(self):
        return [self]


FLOAT32, BFLOAT16 = "float32", "bfloat16"


def fake_torch():
    from types import SimpleNamespace

    return SimpleNamespace(Tensor=FakeTensor, nn=SimpleNamespace(Parameter=FakeParameter), float32=FLOAT32)


def read(module, optimizers=()):
    m = Measurement(fake_torch(), FakeDevice("cuda", 0))
    m.roots = [module]
    m._grad_root = True  # as if the step's forward ran with grad: no no_grad_forward reason
    return m.finish(3, list(optimizers))


def param(ptr, nbytes, dtype, grad_dtype=None, grad_ptr=None):
    p = FakeParameter(ptr, nbytes, dtype)
    if grad_dtype is not None:
        p.grad = FakeTensor(grad_ptr or ptr + 1, nbytes, grad_dtype)
    return p


def test_fp32_bytes_counts_the_float32_parameters_and_gradients_each_storage_once():
    fp32 = param(0x1000, 4000, FLOAT32, FLOAT32)
    bf16 = param(0x2000, 2000, BFLOAT16, BFLOAT16)
    # A bf16 parameter whose gradient the trainer keeps in float32 (an fp32 grad accumulator).
    mixed = param(0x3000, 1000, BFLOAT16, FLOAT32)
    tied = FakeParameter(0x1000, 4000, FLOAT32)  # the first parameter's storage again
    tied.grad = fp32.grad
    elsewhere = param(0x4000, 8000, FLOAT32, FLOAT32)
    elsewhere.device = FakeDevice("cpu")  # offloaded: not this device's memory
    elsewhere.grad.device = FakeDevice("cpu")
    buffer = FakeTensor(0x5000, 64, FLOAT32)  # buffers are not parameters: bf16 is not their remedy
    split = read(FakeModule([fp32, bf16, mixed, tied, elsewhere], [buffer]))
    assert split["parameters_bytes"] == 4000 + 2000 + 1000
    assert split["gradients_bytes"] == 4000 + 2000 + 1000
    assert split["buffers_bytes"] == 64
    assert split["fp32_bytes"] == 4000 + 4000 + 1000
    assert list(split) == SPLIT_KEYS + ["fp32_bytes"]


def test_fp32_bytes_is_zero_for_a_bf16_model_and_counts_megatrons_fp32_main_grad():
    plain = read(FakeModule([param(0x1000, 2000, BFLOAT16, BFLOAT16)]))
    assert plain["fp32_bytes"] == 0 and plain["parameters_bytes"] == 2000
    p = param(0x1000, 2000, BFLOAT16)
    p.main_grad = FakeTensor(0x9000, 4000, FLOAT32)  # Megatron: bf16 weights, fp32 main_grad
    split = read(FakeModule([p]))
    assert split["gradients_bytes"] == 4000 and split["fp32_bytes"] == 4000
    assert split["partial"][0].startswith("main_grad: ")


def test_fp32_bytes_counts_a_zero3_partition_by_its_own_dtype():
    p = FakeParameter(0x1000, 0, BFLOAT16, numel=0)  # ZeRO-3: the parameter is gathered only in use
    p.ds_tensor = FakeTensor(0x2000, 500, FLOAT32)
    split = read(FakeModule([p]))
    assert split["parameters_bytes"] == 500 and split["fp32_bytes"] == 500
    assert split["partial"][0].startswith("zero3_partitions: ")


class FullyShardedDataParallel(FakeModule):
    """An FSDP1 unit as the split sees it: its flat parameter, this rank's shard or the whole."""

    def __init__(self, local, unsharded):
        flat = param(0x7000, local * 4, FLOAT32, FLOAT32)
        flat.numel = lambda: local
        flat._unpadded_unsharded_size = type("Size", (), {"numel": lambda self: unsharded})()
        super().__init__([flat])
        self._flat_param = flat


def test_an_fsdp1_flat_parameter_holding_a_shard_says_the_state_is_sharded():
    split = read(FullyShardedDataParallel(local=500, unsharded=1000))
    assert split["parameters_bytes"] == 2000 and split["fp32_bytes"] == 4000
    assert [r.split(":")[0] for r in split["partial"]] == ["sharded_parameters"]
    # NO_SHARD: the flat parameter is whole; nothing is sharded, so nothing is said.
    assert "partial" not in read(FullyShardedDataParallel(local=1000, unsharded=1000))


def test_tensor_device_defaults_to_the_sources_cuda_device():
    assert StaticStatsSource(info={"cuda_device": 3}).tensor_device() == "cuda:3"
    assert StaticStatsSource().tensor_device() == "cuda"
    assert StaticStatsSource(info={"cuda_device": 0}, tensor_device="cpu").tensor_device() == "cpu"
    assert cuda_device_name({"cuda_device": True}) == "cuda"


@pytest.fixture
def daemon(sock_path):
    with FakeDaemon(sock_path) as d:
        yield d


def attachment(daemon, starter, every):
    client = Client("split", source=StaticStatsSource({"allocated_bytes.all.current": 1}), socket=daemon.path,
                    write_every=0)
    att = Attachment(client, Cadence(every=every, max_rate=None, budget=None))
    att.categories = CategoryProbe(starter, clock=Clock())
    return att, client


class Optimizer:
    pass


def test_the_measured_steps_sample_carries_the_split_whatever_the_cadence(daemon):
    starter = Starter()
    att, client = attachment(daemon, starter, every=100)  # the cadence samples step 1 only
    opt = Optimizer()
    for _ in range(8):
        starter.step = att.step + 1
        att.hook(opt, (), {})
    client.close()
    samples = [m for m in daemon.wait_for(1, type="bye") if m["type"] == "sample"]
    assert [m["step"] for m in samples] == [1, 3]
    assert "categories" not in samples[0] and samples[1]["categories"]["step"] == 3
    # Armed at step 2, which the countdown would otherwise have skipped.
    assert starter.log[:2] == [("arm", 2), ("finish", 2, 3, [opt])]
    assert att.step == 8


def test_every_optimizer_of_a_training_step_is_handed_to_the_measurement(daemon):
    starter = Starter()
    att, client = attachment(daemon, starter, every=1)
    gen, disc = Optimizer(), Optimizer()
    for _ in range(4):
        att.hook(gen, (), {})
        att.hook(disc, (), {})
    client.close()
    finish = [e for e in starter.log if e[0] == "finish"]
    assert finish == [("finish", 0, 3, [gen, disc])]


def test_an_arming_asks_for_a_split_at_the_next_step(daemon):
    from types import SimpleNamespace

    starter = Starter()
    att, client = attachment(daemon, starter, every=1)
    opt = Optimizer()
    for _ in range(4):
        att.hook(opt, (), {})
    assert [e[0] for e in starter.log] == ["arm", "finish"]
    client.armer = SimpleNamespace(armed=object(), at_step=lambda step: None, stop=lambda final=False: None,
                                   stats=lambda: {})
    att._wake()  # what the client does when the daemon's arm request opens an arming
    for _ in range(2):
        att.hook(opt, (), {})
    client.armer = None
    client.close()
    assert [e[:3] for e in starter.log] == [("arm", 0), ("finish", 0, 3), ("arm", 0), ("finish", 0, 6)]


def test_the_split_stays_within_what_the_daemon_takes():
    # A packed token stream's first dimension is no batch the daemon's fit can use: unknown,
    # rather than a sample the daemon refuses whole.
    assert protocol.categories(1, 0, 0, 0, 0, 0, protocol.MAX_BATCH)["batch_size"] == protocol.MAX_BATCH
    assert protocol.categories(1, 0, 0, 0, 0, 0, protocol.MAX_BATCH + 1)["batch_size"] is None
    # fp32_bytes is a part of parameters and gradients.
    assert protocol.categories(1, 10, 6, 0, 0, 0, 4, fp32_bytes=100)["fp32_bytes"] == 16
    assert protocol.categories(1, 10, 6, 0, 0, 0, 4, fp32_bytes=8)["fp32_bytes"] == 8
