"""The memory split (categories.py) on real torch, CPU: each category against the tensors' own
sizes, computed here independently (the parameters, .grad and optimizer state by their numel,
the activations by walking the autograd graph's saved tensors), and every hook gone after the
measured step. Only the allocator's numbers are injected; `tensor_device="cpu"` makes the CPU
tensors the ones that count."""

import json
import os
import sys

import pytest

import support
from support import MEM_INFO, STATS, run_child

torch = support.require("torch")

# These tests compute what they expect with torch's own hook stack reader and FSDP2/DTensor, which
# torch 2.1 lacks; the client's path for older torch (no reader) is tested here by emulation on
# the newest torch. Not yet run against torch 2.1 itself: issue 40's next step.
_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
pytestmark = pytest.mark.skipif(
    _TORCH < (2, 8), reason="torch %s: the expected values need torch >= 2.8" % torch.__version__
)

import gpumon_client  # noqa: E402
from gpumon_client import StaticStatsSource, categories  # noqa: E402
from gpumon_client.testing import FakeDaemon  # noqa: E402

EXACT = {"max_rate": None, "budget": None}  # every step sampled: the tests name the steps
module_hooks = torch.nn.modules.module


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.delenv("GPUMON_CATEGORIES", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def daemon(sock_dir):
    with FakeDaemon(os.path.join(sock_dir, "ingest.sock")) as d:
        yield d


def cpu_source():
    return StaticStatsSource(stats=dict(STATS), mem_info=MEM_INFO, info={"cuda_device": 0}, tensor_device="cpu")


def run(daemon, step, steps=4, source=None, **kw):
    """attach(), `steps` training steps (step(i), i from 0), detach(); the samples by step."""
    options = dict(EXACT)
    options.update(kw)
    handle = gpumon_client.attach("split", source=source or cpu_source(), socket=daemon.path, **options)
    assert handle.active
    for i in range(steps):
        step(i)
    gpumon_client.detach(timeout=1.0)
    msgs = daemon.wait_for(1, type="bye")
    assert handle.client.stats()["internal_errors"] == 0
    return {m["step"]: m for m in msgs if m["type"] == "sample"}, handle


def split_of(samples, step=3):
    carrying = [s for s, m in samples.items() if "categories" in m]
    assert carrying == [step], carrying
    split = samples[step]["categories"]
    assert split["step"] == step
    return split


def nbytes(t):
    return t.numel() * t.element_size()


def unique(tensors):
    out = {}
    for t in tensors:
        if t is not None:
            out[t.untyped_storage().data_ptr()] = t
    return list(out.values())


def params_bytes(*models):
    return sum(nbytes(p) for p in unique(p for m in models for p in m.parameters()))


def grads_bytes(*models):
    return sum(nbytes(p.grad) for p in unique(p for m in models for p in m.parameters()) if p.grad is not None)


def state_bytes(*opts):
    return sum(nbytes(v) for o in opts for st in o.state.values() for v in st.values() if isinstance(v, torch.Tensor))


def buffers_bytes(*models):
    return sum(nbytes(b) for b in unique(b for m in models for b in m.buffers()))


def saved_bytes(loss, *models):
    """What the autograd graph behind `loss` saved for backward, found by walking its nodes'
    `_saved_*` attributes: each storage once, parameters and buffers left out."""
    exclude = {t.untyped_storage().data_ptr() for m in models for t in list(m.parameters()) + list(m.buffers())}
    seen, storages, stack = set(), {}, [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(fn, name)
            except Exception:
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in exclude:
                        storages[ptr] = t.untyped_storage().nbytes()
        stack.extend(f for f, _ in fn.next_functions)
    return sum(storages.values())


def close(measured, expected, rel=0.03):
    assert expected > 0
    assert abs(measured - expected) <= rel * expected, (measured, expected)


def no_hooks_left():
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return (
        not module_hooks._global_forward_pre_hooks
        and not module_hooks._global_forward_hooks
        and not getattr(module_hooks, "_global_forward_hooks_with_kwargs", {})
        and not getattr(module_hooks, "_global_forward_hooks_always_called", {})
        and top is None
    )


def mlp(width=256, depth=2, inputs=64, outputs=10):
    torch.manual_seed(0)
    layers, n = [], inputs
    for _ in range(depth):
        layers += [torch.nn.Linear(n, width), torch.nn.ReLU()]
        n = width
    layers.append(torch.nn.Linear(n, outputs))
    return torch.nn.Sequential(*layers)


def batch(i, rows=32, cols=64):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(i))


def test_mlp_with_adamw_each_category_against_the_tensors(daemon):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    walked, hooks_at = {}, {}

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = model(batch(i)).pow(2).mean()
        walked[i + 1] = saved_bytes(loss, model)
        loss.backward()
        opt.step()
        hooks_at[i + 1] = no_hooks_left()
        if i + 1 == 3:
            walked["grads"] = grads_bytes(model)

    samples, handle = run(daemon, step, steps=6)
    split = split_of(samples)
    assert split["parameters_bytes"] == params_bytes(model)
    assert split["gradients_bytes"] == walked["grads"] == params_bytes(model)
    # AdamW: exp_avg and exp_avg_sq per parameter (fp32, the parameters' size), and a step counter.
    n_params = len(list(model.parameters()))
    assert split["optimizer_state_bytes"] == state_bytes(opt) == 2 * params_bytes(model) + 4 * n_params
    assert split["buffers_bytes"] == 0
    close(split["activations_bytes"], walked[3])
    assert split["batch_size"] == 32
    assert split["fp32_bytes"] == split["parameters_bytes"] + split["gradients_bytes"]
    assert "partial" not in split
    # Armed at the end of step 2 (for step 3), gone at the end of step 3; no other step has any.
    assert hooks_at == {1: True, 2: False, 3: True, 4: True, 5: True, 6: True}
    assert handle.categories.stats()["measured"] == 1


def test_the_default_cadence_samples_the_measured_step(daemon):
    model = mlp(width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        opt.zero_grad()
        model(batch(i)).sum().backward()
        opt.step()

    samples, _ = run(daemon, step, steps=20, max_rate=10.0, budget=0.005)
    split = split_of(samples)
    assert split["parameters_bytes"] == params_bytes(model) and split["optimizer_state_bytes"] == 0


def test_tied_weights_count_once(daemon):
    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 64)
            self.mix = torch.nn.Linear(64, 64)
            self.head = torch.nn.Linear(64, 1000, bias=False)
            self.head.weight = self.embed.weight  # tied

        def forward(self, tokens):
            return self.head(torch.tanh(self.mix(self.embed(tokens))))

    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    walked = {}

    def step(i):
        opt.zero_grad()
        tokens = torch.randint(0, 1000, (8, 16), generator=torch.Generator().manual_seed(i))
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        walked[i + 1] = saved_bytes(loss, model)
        loss.backward()
        opt.step()

    samples, _ = run(daemon, step)
    split = split_of(samples)
    tied = 1000 * 64 * 4
    assert split["parameters_bytes"] == params_bytes(model) == tied + (64 * 64 + 64) * 4
    assert split["gradients_bytes"] == params_bytes(model)
    assert split["optimizer_state_bytes"] == state_bytes(opt)
    # The loss is computed outside the model: its saved logits count too.
    close(split["activations_bytes"], walked[3])
    assert split["batch_size"] == 8


def test_a_frozen_base_counts_its_parameters_but_no_gradients_or_state(daemon):
    class LoRALinear(torch.nn.Module):
        def __init__(self, n, rank=4):
            super().__init__()
            self.base = torch.nn.Linear(n, n)
            self.base.requires_grad_(False)
            self.lora_a = torch.nn.Linear(n, rank, bias=False)
            self.lora_b = torch.nn.Linear(rank, n, bias=False)

        def forward(self, x):
            return self.base(x) + self.lora_b(self.lora_a(x))

    torch.manual_seed(0)
    model = torch.nn.Sequential(LoRALinear(128), torch.nn.GELU(), LoRALinear(128))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3)
    walked = {}

    def step(i):
        opt.zero_grad()
        loss = model(batch(i, cols=128)).pow(2).mean()
        walked[i + 1] = saved_bytes(loss, model)
        loss.backward()
        opt.step()

    samples, _ = run(daemon, step)
    split = split_of(samples)
    frozen = sum(nbytes(p) for p in model.parameters() if not p.requires_grad)
    lora = sum(nbytes(p) for p in trainable)
    assert frozen > 10 * lora
    assert split["parameters_bytes"] == frozen + lora
    assert split["gradients_bytes"] == lora == grads_bytes(model)
    assert split["optimizer_state_bytes"] == state_bytes(opt) == 2 * lora + 4 * len(trainable)
    close(split["activations_bytes"], walked[3])
    assert "partial" not in split


def test_gradient_accumulation_counts_the_gradients_and_one_micro_batch(daemon):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    micro = 4
    walked = {}

    def step(i):
        opt.zero_grad()
        for k in range(micro):
            loss = model(batch(10 * i + k, rows=16)).pow(2).mean() / micro
            walked[(i + 1, k)] = saved_bytes(loss, model)
            loss.backward()
        opt.step()

    samples, _ = run(daemon, step)
    split = split_of(samples)
    assert split["gradients_bytes"] == params_bytes(model)
    # Each micro-batch's saved tensors are freed by its backward before the next forward: the
    # most held at once is one micro-batch's, not four.
    close(split["activations_bytes"], walked[(3, 0)])
    assert split["batch_size"] == 16


class Blocks(torch.nn.Module):
    def __init__(self, checkpoint=None, width=256, depth=6):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Linear(64, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width))
            for _ in range(depth)
        )
        self.checkpoint = checkpoint

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            if self.checkpoint is None:
                h = h + block(h)
            else:
                h = h + torch.utils.checkpoint.checkpoint(block, h, use_reentrant=self.checkpoint == "reentrant")
        return h


def blocks_split(daemon, checkpoint):
    model = Blocks(checkpoint)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(i):
        opt.zero_grad()
        model(batch(i, rows=64)).pow(2).mean().backward()
        opt.step()

    samples, _ = run(daemon, step)
    return split_of(samples), model


@pytest.mark.parametrize("checkpoint", ["non_reentrant", "reentrant"])
def test_activation_checkpointing_shrinks_the_activations(daemon, sock_dir, checkpoint):
    plain, model = blocks_split(daemon, None)
    with FakeDaemon(os.path.join(sock_dir, "second.sock")) as second:
        checkpointed, _ = blocks_split(second, checkpoint)
    # Each block saves its input, two GELU-sized activations and a linear's input without
    # checkpointing (about 4 x 64 x 256 x 4 bytes); with it, only the block's input is kept
    # until backward recomputes one block at a time.
    assert checkpointed["activations_bytes"] < 0.5 * plain["activations_bytes"], (checkpointed, plain)
    for key in ("parameters_bytes", "gradients_bytes", "buffers_bytes", "batch_size"):
        assert checkpointed[key] == plain[key]
    assert plain["parameters_bytes"] == params_bytes(model)


def test_batchnorm_buffers(daemon):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    walked = {}

    def step(i):
        opt.zero_grad()
        x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(i))
        loss = model(x).pow(2).mean()
        walked[i + 1] = saved_bytes(loss, model)
        loss.backward()
        opt.step()

    samples, _ = run(daemon, step)
    split = split_of(samples)
    # running_mean and running_var (fp32, one per channel) and num_batches_tracked (int64).
    assert split["buffers_bytes"] == buffers_bytes(model) == (16 + 32) * 2 * 4 + 2 * 8
    assert split["optimizer_state_bytes"] == state_bytes(opt) == params_bytes(model)  # SGD momentum
    close(split["activations_bytes"], walked[3])
    assert split["batch_size"] == 8


def test_two_optimizers_both_states_count(daemon):
    gen, disc = mlp(width=64, outputs=64), mlp(width=32, inputs=64, outputs=1)
    opt_g = torch.optim.AdamW(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(disc.parameters(), lr=1e-3, momentum=0.9)

    def step(i):
        opt_g.zero_grad()
        opt_d.zero_grad()
        disc(gen(batch(i))).mean().backward()
        opt_g.step()
        opt_d.step()

    samples, _ = run(daemon, step, steps=5)
    split = split_of(samples)
    assert split["parameters_bytes"] == params_bytes(gen, disc)
    assert split["optimizer_state_bytes"] == state_bytes(opt_g, opt_d)


def fp32_of(*models):
    """Of the models' parameters and gradients, the bytes in float32, each storage once."""
    tensors = unique(t for m in models for p in m.parameters() for t in (p, p.grad))
    return sum(nbytes(t) for t in tensors if t.dtype == torch.float32)


def train_split(daemon, model, opt):
    grads = {}

    def step(i):
        opt.zero_grad(set_to_none=True)
        x = batch(i).to(next(model.parameters()).dtype)
        model(x).float().pow(2).mean().backward()
        if i + 1 == 3:
            grads["fp32"] = fp32_of(model)
        opt.step()

    samples, _ = run(daemon, step)
    return split_of(samples), grads["fp32"]


def test_fp32_bytes_an_fp32_model_is_all_of_its_parameters_and_gradients(daemon):
    model = mlp()
    split, walked = train_split(daemon, model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert split["parameters_bytes"] == split["gradients_bytes"] == params_bytes(model)
    assert split["fp32_bytes"] == walked == 2 * params_bytes(model)


def test_fp32_bytes_a_bf16_model_has_none(daemon):
    model = mlp().to(torch.bfloat16)
    split, walked = train_split(daemon, model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert split["parameters_bytes"] == params_bytes(model) > 0
    assert split["gradients_bytes"] == params_bytes(model)
    # AdamW keeps its state in the parameters' dtype: no float32 there either, and state is not
    # what fp32_bytes counts anyway.
    assert split["fp32_bytes"] == walked == 0


def test_fp32_bytes_a_mixed_model_counts_its_fp32_part(daemon):
    # A bf16 body and an fp32 head (as trainers keep norms or the output layer in fp32).
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(torch.bfloat16)
    head = torch.nn.Linear(256, 10)

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = body, head

        def forward(self, x):
            return self.head(self.body(x.to(torch.bfloat16)).float())

    model = Mixed()
    split, walked = train_split(daemon, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert split["parameters_bytes"] == params_bytes(model) == params_bytes(body) + params_bytes(head)
    assert split["gradients_bytes"] == params_bytes(model)
    assert split["fp32_bytes"] == walked == 2 * params_bytes(head)
    assert 0 < split["fp32_bytes"] < split["parameters_bytes"] + split["gradients_bytes"]


def test_batch_size_from_keyword_arguments(daemon):
    class Keyworded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 8)

        def forward(self, input_ids=None, labels=None):
            return torch.nn.functional.mse_loss(self.proj(input_ids), labels)

    torch.manual_seed(0)
    model = Keyworded()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        opt.zero_grad()
        model(input_ids=batch(i, rows=12), labels=torch.zeros(12, 8)).backward()
        opt.step()

    samples, _ = run(daemon, step)
    assert split_of(samples)["batch_size"] == 12


def test_the_trainers_own_saved_tensor_hooks_still_run_and_what_they_keep_counts(daemon):
    # The trainer packs saved tensors itself (as save_on_cpu or an activation offloader does):
    # on the measured step its hooks see the same tensors as on any other, and the split counts
    # what they return.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls, walked = {}, {}

    def step(i):
        counts = calls.setdefault(i + 1, [0, 0])

        def pack(t):
            counts[0] += 1
            return ("kept", t.detach())

        def unpack(packed):
            counts[1] += 1
            return packed[1]

        opt.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = model(batch(i))
        loss = out.pow(2).mean()
        walked[i + 1] = saved_bytes(loss, model)
        loss.backward()
        opt.step()

    samples, _ = run(daemon, step)
    split = split_of(samples)
    assert calls[3] == calls[2] == calls[4] and calls[3][0] > 0
    close(split["activations_bytes"], walked[3])
    assert no_hooks_left()


def test_a_trainer_context_kept_past_the_step_leaves_no_hook_behind(daemon):
    # The trainer's own hooks are pushed after the model ran and popped after optimizer.step():
    # ours, under them, cannot be popped at the step; they go at the next step.
    model = mlp(width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tops = {}

    def step(i):
        opt.zero_grad()
        out = model(batch(i))
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t):
            out.pow(2).mean().backward()
            opt.step()
        tops[i + 1] = no_hooks_left()

    samples, handle = run(daemon, step, steps=6)
    split_of(samples)
    assert tops[6] and tops[5] and tops[4]


def test_older_torch_without_the_hooks_stack_reader(daemon, monkeypatch):
    # torch < 2.8 has no _top_saved_tensors_default_hooks: the client probes instead.
    monkeypatch.setattr(categories, "_top_hooks_fn", lambda torch: None)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    walked = {}

    def step(i):
        opt.zero_grad()
        loss = model(batch(i)).pow(2).mean()
        walked[i + 1] = saved_bytes(loss, model)
        loss.backward()
        opt.step()

    samples, _ = run(daemon, step)
    close(split_of(samples)["activations_bytes"], walked[3])
    assert no_hooks_left()


def test_older_torch_leaves_the_trainers_hooks_alone_and_says_so(daemon, monkeypatch, sock_dir):
    monkeypatch.setattr(categories, "_top_hooks_fn", lambda torch: None)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = {}

    def step(i):
        counts = calls.setdefault(i + 1, [0])

        def pack(t):
            counts[0] += 1
            return t.detach()

        opt.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(batch(i)).pow(2).mean().backward()
        opt.step()

    samples, _ = run(daemon, step)
    split = split_of(samples)
    assert split["activations_bytes"] == 0
    assert [r.split(":")[0] for r in split["partial"]] == [categories.PARTIAL_ACTIVATIONS]
    # Their pack hook saw every tensor it sees at any step, and once more: the probe (one
    # 0-dimensional tensor) that found it active.
    assert calls[3][0] == calls[2][0] + 1
    assert split["parameters_bytes"] == params_bytes(model)
    assert no_hooks_left()


def test_detach_while_armed_removes_the_hooks(daemon):
    model = mlp(width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = gpumon_client.attach(source=cpu_source(), socket=daemon.path, **EXACT)
    for i in range(2):
        opt.zero_grad()
        model(batch(i)).sum().backward()
        opt.step()
    assert handle.categories.measuring is not None and not no_hooks_left()
    gpumon_client.detach()
    assert no_hooks_left()


def test_no_tensor_on_the_sessions_device_sends_no_split(daemon):
    # The default device is the source's CUDA device: CPU tensors do not count, nothing is sent.
    model = mlp(width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        opt.zero_grad()
        model(batch(i)).sum().backward()
        opt.step()

    samples, handle = run(daemon, step, source=support.make_source())
    assert not [m for m in samples.values() if "categories" in m]
    assert handle.categories.failed == 1 and no_hooks_left()


def test_a_failing_measurement_never_reaches_the_trainer(daemon, monkeypatch):
    def broken(self, step, optimizers):
        raise RuntimeError("boom")

    monkeypatch.setattr(categories.Measurement, "_read", broken)
    model = mlp(width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = gpumon_client.attach(source=cpu_source(), socket=daemon.path, **EXACT)
    handle.categories.interval = 0.0  # retry at once
    for i in range(12):
        opt.zero_grad()
        model(batch(i)).sum().backward()
        opt.step()
        assert handle.categories.measuring is not None or no_hooks_left()
    stats = handle.categories.stats()
    assert stats["failed"] == 3 and stats["off"] == "3 measurements in a row failed"
    assert no_hooks_left()
    gpumon_client.detach()


def test_turned_off(daemon, monkeypatch):
    monkeypatch.setenv("GPUMON_CATEGORIES", "0")
    handle = gpumon_client.attach(source=cpu_source(), socket=daemon.path, **EXACT)
    assert handle.categories is None


FSDP_SCRIPT = """\
import json, os, sys, tempfile
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import gpumon_client
from gpumon_client import StaticStatsSource

rank, world, store, sock = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
full = sum(p.numel() * p.element_size() for p in model.parameters())
mode = os.environ["MODE"]
if mode.startswith("fsdp1"):
    from torch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=mode == "fsdp1_orig")
elif mode == "fsdp2":
    from torch.distributed.fsdp import fully_shard
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
else:  # a DTensor model: parameters sharded on dim 0 by hand
    from torch.distributed.tensor import Shard, distribute_tensor
    for mod in (model[0], model[2]):
        for name, p in list(mod.named_parameters()):
            setattr(mod, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
    # Forward runs on full tensors gathered on the fly: a replicated input.
    from torch.distributed.tensor import Replicate, distribute_module
    distribute_module(model, mesh, input_fn=lambda mod, inputs, mesh: tuple(
        torch.distributed.tensor.DTensor.from_local(x, mesh, [Replicate()]) for x in inputs))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if mode.startswith("fsdp1"):  # the flat parameter's storage: this rank's padded shard
    local = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
else:
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
src = StaticStatsSource({"allocated_bytes.all.current": 1}, (1, 2), {"cuda_device": 0}, tensor_device="cpu")
handle = gpumon_client.attach("fsdp", source=src, socket=sock, rank=rank, world_size=world, max_rate=None, budget=None)
for i in range(4):
    opt.zero_grad()
    out = model(torch.randn(32, 64, generator=torch.Generator().manual_seed(i)))
    if hasattr(out, "full_tensor"):
        out = out.full_tensor()
    out.pow(2).mean().backward()
    opt.step()
state = sum(v.to_local().numel() * v.element_size() if hasattr(v, "to_local") else v.numel() * v.element_size()
            for st in opt.state.values() for v in st.values())
print(json.dumps({"rank": rank, "full": full, "local": local, "state": state, "split": handle.categories.last,
                  "stats": handle.categories.stats()}), flush=True)
gpumon_client.detach()
dist.destroy_process_group()
# Out without the interpreter's teardown: on this 2-core machine gloo's threads were sometimes
# still being destroyed then, and the C++ runtime aborted ("terminate called without an active
# exception") after the result above was written. Torch's teardown is not what is tested here.
sys.stdout.flush()
os._exit(0)
"""


def run_ranks(tmp_path, child_env, mode, world):
    import subprocess

    script = tmp_path / "ranks.py"
    script.write_text(FSDP_SCRIPT)
    store = str(tmp_path / "store")
    env = dict(child_env, MODE=mode, OMP_NUM_THREADS="1")
    env.pop("GPUMON_TEST_SOURCE", None)
    sock = str(tmp_path / "absent.sock")
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(world), store, sock], env=env, cwd=str(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-4000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("mode", ["fsdp2", "dtensor", "fsdp1", "fsdp1_orig"])
def test_sharded_parameters_count_this_ranks_shard(tmp_path, child_env, mode):
    # Two ranks on gloo: each holds half of every parameter; the split counts its local shard
    # and says so, rather than the global size. FSDP1 says so with sharded_parameters (its flat
    # parameter; with use_orig_params, also the original parameters of size 0).
    outs = run_ranks(tmp_path, child_env, mode, 2)
    code = categories.PARTIAL_SHARDED if mode.startswith("fsdp1") else categories.PARTIAL_DTENSOR
    for out in outs:
        split = out["split"]
        assert split is not None, out
        assert split["parameters_bytes"] == out["local"] < out["full"]
        assert out["local"] <= out["full"] // 2 + 1024
        assert split["optimizer_state_bytes"] == out["state"]
        assert split["gradients_bytes"] == out["local"]
        # An fp32 model: its local shards of parameters and gradients are all float32.
        assert split["fp32_bytes"] == 2 * out["local"]
        assert [r.split(":")[0] for r in split["partial"]] == [code], split["partial"]


COMPILE_SCRIPT = """\
import json
import torch
import gpumon_client
from gpumon_client import StaticStatsSource
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
src = StaticStatsSource({"allocated_bytes.all.current": 1}, (1, 2), {"cuda_device": 0}, tensor_device="cpu")
handle = gpumon_client.attach("compiled", source=src, socket="/nonexistent/x.sock", max_rate=None, budget=None)
graphs = []
for i in range(5):
    opt.zero_grad(set_to_none=True)
    compiled(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    graphs.append(counters["stats"]["unique_graphs"])
print(json.dumps({"graphs": graphs, "stats": handle.categories.stats()}), flush=True)
"""


def test_a_compiled_model_is_not_measured_and_not_recompiled(tmp_path, child_env):
    script = tmp_path / "compiled.py"
    script.write_text(COMPILE_SCRIPT)
    child = run_child([sys.executable, str(script)], env=child_env, cwd=str(tmp_path), timeout=300)
    assert child.returncode == 0, child
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(set(out["graphs"])) == 1, out  # compiled once, at the first step; never again
    assert out["stats"]["measured"] == 0 and "torch.compile" in out["stats"]["off"], out
