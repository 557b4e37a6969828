"""attach() on real torch optimizers (CPU), with only the allocator's numbers injected."""

import os
import time

import pytest

import support
from support import INFO, check_sample_payload, of_type, steps, summary, train_step

torch = support.require("torch")

import gpumon_client  # noqa: E402
from gpumon_client import testing  # noqa: E402

EXACT = {"max_rate": None, "budget": None}  # cadence limits off: every training step is sampled


def model_and(opt_cls, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, opt_cls(model.parameters(), **kw)


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def changed(before, model):
    return [not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())]


def finish(handle, ingest):
    """Ends the session; the training loop and detach() must not raise or hang without a daemon."""
    start = time.monotonic()
    gpumon_client.detach(timeout=0.5)
    assert time.monotonic() - start < 2.0
    stats = handle.client.stats()
    assert stats["internal_errors"] == 0, stats
    if not ingest.up:
        assert not stats["connected"]
    return ingest.messages()


def check_session(msgs, job, sample_steps):
    assert [m["type"] for m in msgs] == ["hello"] + ["sample"] * len(sample_steps) + ["bye"], summary(msgs)
    hello = msgs[0]
    assert (hello["job"], hello["rank"], hello["world_size"], hello["pid"]) == (job, 0, 1, os.getpid())
    assert (hello["cuda_device"], hello["gpu_uuid"]) == (INFO["cuda_device"], INFO["gpu_uuid"])
    assert steps(msgs) == sample_steps
    for sample in of_type(msgs, "sample"):
        assert sample["phase"] == "train"
        check_sample_payload(sample)


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.AdamW, {"lr": 1e-2})], ids=["SGD", "AdamW"])
def test_one_sample_per_step(ingest, source, opt_cls, kw):
    model, opt = model_and(opt_cls, **kw)
    handle = gpumon_client.attach("real", source=source, socket=ingest.path, rank=0, world_size=1, **EXACT)
    assert handle.active
    before = params_of(model)
    for i in range(5):
        train_step(torch, model, [opt], seed=i)
    assert all(changed(before, model))  # the optimizer really stepped, hooks and all
    msgs = finish(handle, ingest)
    if ingest.up:
        check_session(msgs, "real", [1, 2, 3, 4, 5])


def test_hello_carries_the_allocator_limit(ingest, source):
    model, opt = model_and(torch.optim.SGD, lr=0.1)
    handle = gpumon_client.attach(source=source, socket=ingest.path, **EXACT)
    train_step(torch, model, [opt], seed=0)
    msgs = finish(handle, ingest)
    if ingest.up:
        assert msgs[0]["alloc_limit"] == INFO["alloc_limit"]


def test_two_optimizers_step_once_per_training_step(ingest, source):
    # A GAN-like loop: both optimizers step in each training step, in a fixed order.
    torch.manual_seed(0)
    gen, disc = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    opt_g = torch.optim.AdamW(gen.parameters(), lr=1e-2)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    handle = gpumon_client.attach("gan", source=source, socket=ingest.path, rank=0, world_size=1, **EXACT)
    for i in range(4):
        for opt in (opt_d, opt_g):
            opt.zero_grad(set_to_none=True)
        loss = disc(gen(support.tiny_batch(torch, i))).mean()
        loss.backward()
        opt_d.step()
        opt_g.step()
    assert opt_g.state[gen.weight]["step"].item() == 4
    msgs = finish(handle, ingest)
    if ingest.up:
        check_session(msgs, "gan", [1, 2, 3, 4])


def test_an_optimizer_that_steps_every_other_step(ingest, source):
    # The first optimizer steps every training step, the second only on odd ones: still one
    # sample per training step, never two.
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    handle = gpumon_client.attach("alt", source=source, socket=ingest.path, rank=0, world_size=1, **EXACT)
    for i in range(6):
        train_step(torch, lambda x: b(a(x)), [opt_a, opt_b] if i % 2 else [opt_a], seed=i)
    msgs = finish(handle, ingest)
    if ingest.up:
        check_session(msgs, "alt", [1, 2, 3, 4, 5, 6])


def test_zero_grad_set_to_none_with_an_idle_optimizer(ingest, source):
    # zero_grad(set_to_none=True) leaves the unused branch's grads None; its optimizer still
    # steps (a no-op on those parameters) and the training step is counted once.
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
    opt_used, opt_unused = torch.optim.AdamW(used.parameters(), lr=1e-2), torch.optim.AdamW(unused.parameters(), lr=1e-2)
    before_unused = params_of(unused)
    handle = gpumon_client.attach("none", source=source, socket=ingest.path, rank=0, world_size=1, **EXACT)
    for i in range(3):
        train_step(torch, used, [opt_used, opt_unused], seed=i, set_to_none=True)
        assert unused.weight.grad is None
    assert not any(changed(before_unused, unused))
    msgs = finish(handle, ingest)
    if ingest.up:
        check_session(msgs, "none", [1, 2, 3])


def _cpu_grad_scaler():
    amp_scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if amp_scaler is None:
        pytest.skip("torch %s has no torch.amp.GradScaler (CUDA-only torch.cuda.amp.GradScaler)" % torch.__version__)
    try:
        return amp_scaler("cpu", init_scale=2.0**8)
    except Exception as exc:  # some versions have the class but not the CPU device
        pytest.skip("torch %s: GradScaler('cpu') is unavailable: %r" % (torch.__version__, exc))


def test_grad_scaler_skipping_a_step_is_not_a_step(ingest, source):
    scaler = _cpu_grad_scaler()
    model, opt = model_and(torch.optim.AdamW, lr=1e-2)
    handle = gpumon_client.attach("amp", source=source, socket=ingest.path, rank=0, world_size=1, **EXACT)
    scales = []
    for i in range(4):
        opt.zero_grad(set_to_none=True)
        x = support.tiny_batch(torch, i)
        if i == 1:
            x[0, 0] = float("inf")  # inf grads: the scaler must skip optimizer.step()
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales[1] < scales[0]  # the scaler backed off: it did see the inf and skip
    assert opt.state[model[0].weight]["step"].item() == 3
    msgs = finish(handle, ingest)
    if ingest.up:
        check_session(msgs, "amp", [1, 2, 3])


def test_default_cadence_on_a_fast_loop(ingest, source):
    # The default cadence (max_rate, budget) samples a tiny fast loop far less than once a step,
    # but always its first step, and steps are labelled with the counted training step.
    model, opt = model_and(torch.optim.SGD, lr=0.01)
    handle = gpumon_client.attach("fast", source=source, socket=ingest.path, rank=0, world_size=1)
    n = 400
    start = time.monotonic()
    for i in range(n):
        train_step(torch, model, [opt], seed=i % 8)
    elapsed = time.monotonic() - start
    msgs = finish(handle, ingest)
    if ingest.up:
        got = steps(msgs)
        assert got and got[0] == 1
        assert got == sorted(set(got)) and got[-1] <= n
        # max_rate defaults to 10/s: at most one sample per 100 ms after the first, give or take one.
        assert len(got) <= 2 + int(elapsed * 10), (got, elapsed)
        assert len(got) < n


def test_use_source_is_the_default_source(ingest, source):
    testing.use_source(source)
    model, opt = model_and(torch.optim.SGD, lr=0.1)
    handle = gpumon_client.attach("injected", socket=ingest.path, rank=0, world_size=1, **EXACT)
    assert handle.active
    for i in range(2):
        train_step(torch, model, [opt], seed=i)
    msgs = finish(handle, ingest)
    if ingest.up:
        check_session(msgs, "injected", [1, 2])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA is unavailable")
def test_no_cuda_and_no_source_is_a_quiet_no_op(sock_dir):
    from gpumon_client.testing import FakeDaemon

    path = os.path.join(sock_dir, "ingest.sock")
    with FakeDaemon(path) as daemon:
        model, opt = model_and(torch.optim.SGD, lr=0.1)
        handle = gpumon_client.attach("nocuda", socket=path)
        assert not handle.active and handle.client is None
        for i in range(2):
            train_step(torch, model, [opt], seed=i)
        gpumon_client.detach()
        time.sleep(0.05)
        assert not daemon.connections


def test_client_is_the_source_tree():
    # pytest's rootdir (clients/python) puts the source tree first: an installed copy must not win.
    assert os.path.dirname(os.path.dirname(gpumon_client.__file__)) == support.CLIENT_ROOT


def test_a_bad_write_every_is_refused_at_attach_naming_it(source, tmp_path):
    with pytest.raises(ValueError, match=r"write_every=-1"):
        gpumon_client.attach("bad", source=source, socket=str(tmp_path / "s"), write_every=-1)
    assert gpumon_client.hooks._state is None  # nothing was left attached
