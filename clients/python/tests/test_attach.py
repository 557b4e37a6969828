import gpumon_client
from gpumon_client import hooks as attach_mod
from gpumon_client.testing import FakeDaemon

import fake_torch as ft


def samples(msgs):
    return [m for m in msgs if m["type"] == "sample"]


def test_one_sample_per_optimizer_step_with_device_identity(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        handle = gpumon_client.attach(job="llama", socket=sock_path)
        assert handle.active
        opt = fake_torch.Optimizer()
        for _ in range(3):
            opt.step()
        msgs = d.wait_for(4)
        hello = msgs[0]
        assert hello["gpu_uuid"] == "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"
        assert (hello["torch"], hello["allocator"], hello["cuda_device"]) == ("2.5.1+fake", "native", 0)
        assert hello["expandable_segments"] is False and hello["job"] == "llama"
        assert [m["step"] for m in samples(msgs)] == [1, 2, 3]
        assert samples(msgs)[0]["device_free"] == 47244640256
        gpumon_client.detach()
        assert d.wait_for(1, type="bye")[-1]["type"] == "bye"
        assert not fake_torch.optim.optimizer._hooks


def test_several_optimizers_in_one_step_give_one_sample(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        gpumon_client.attach(socket=sock_path)
        gen, disc, slow = fake_torch.Optimizer(), fake_torch.Optimizer(), fake_torch.Optimizer()
        for i in range(4):
            gen.step()
            disc.step()
            if i % 2:
                slow.step()
        msgs = d.wait_for(5)
        assert [m["step"] for m in samples(msgs)] == [1, 2, 3, 4]
        assert fake_torch.cuda.stats_calls == 4


def test_every_n_steps(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        gpumon_client.attach(socket=sock_path, every=3)
        opt = fake_torch.Optimizer()
        for _ in range(7):
            opt.step()
        assert [m["step"] for m in samples(d.wait_for(3))] == [3, 6]


def test_attach_is_idempotent(sock_path, fake_torch):
    a = gpumon_client.attach(socket=sock_path)
    assert gpumon_client.attach(socket=sock_path) is a
    assert len(fake_torch.optim.optimizer._hooks) == 1


def test_oom_observer_sends_an_event(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        gpumon_client.attach(socket=sock_path)
        ft.raise_oom(fake_torch)
        msgs = d.wait_for(2)
        oom = msgs[-1]
        assert (oom["type"], oom["kind"], oom["alloc_bytes"], oom["device_free"]) == ("event", "oom", 2 * 1024**3, 100 * 1024**2)
        assert oom["detail"].startswith("CUDA out of memory")


def test_oom_observer_waits_for_cuda_init(sock_path, fake_torch):
    fake_torch.cuda.initialized = False
    gpumon_client.attach(socket=sock_path)
    assert fake_torch._C.oom_observers == [] and len(fake_torch.cuda.queued) == 1
    fake_torch.cuda.lazy_init()
    assert len(fake_torch._C.oom_observers) == 1


def test_oom_observer_without_lazy_call_installs_at_first_step(sock_path, fake_torch):
    fake_torch.cuda.initialized = False
    del fake_torch.cuda._lazy_call
    gpumon_client.attach(socket=sock_path)
    assert fake_torch._C.oom_observers == []
    fake_torch.cuda.initialized = True
    fake_torch.Optimizer().step()
    assert len(fake_torch._C.oom_observers) == 1


def test_oom_observer_is_installed_once_and_silent_after_detach(sock_path, fake_torch):
    gpumon_client.attach(socket=sock_path)
    gpumon_client.detach()
    gpumon_client.attach(socket=sock_path)
    assert len(fake_torch._C.oom_observers) == 1
    gpumon_client.detach()
    ft.raise_oom(fake_torch)  # no attachment: nothing happens, nothing raises


def test_torch_without_oom_observer_api(sock_path, fake_torch):
    del fake_torch._C._cuda_attach_out_of_memory_observer
    assert gpumon_client.attach(socket=sock_path).active


def test_broken_cuda_never_reaches_the_training_loop(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        handle = gpumon_client.attach(socket=sock_path)
        fake_torch.cuda.fail_stats = True
        opt = fake_torch.Optimizer()
        opt.step()
        fake_torch.cuda.fail_stats = False
        opt.step()
        assert [m["step"] for m in samples(d.wait_for(2))] == [2]
        assert handle.client.stats()["internal_errors"] == 1


def test_daemon_down_training_goes_on(sock_path, fake_torch):
    handle = gpumon_client.attach(socket=sock_path, max_buffer=8)
    opt = fake_torch.Optimizer()
    for _ in range(20):
        opt.step()
    st = handle.client.stats()
    assert st["buffered"] == 8 and st["dropped"] == 12


def test_no_torch_or_no_cuda_is_a_no_op(sock_path, monkeypatch, fake_torch):
    fake_torch.cuda.is_available = lambda: False
    assert gpumon_client.attach(socket=sock_path).client is None
    monkeypatch.setattr(attach_mod, "_import_torch", lambda: None)
    assert gpumon_client.attach(socket=sock_path).client is None


def test_device_chosen_after_attach_is_the_one_reported(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        gpumon_client.attach(socket=sock_path)
        fake_torch.cuda.device = 3  # torch.cuda.set_device(local_rank) after attach()
        fake_torch.Optimizer().step()
        assert d.wait_for(2)[0]["cuda_device"] == 3


def test_expandable_segments_from_alloc_conf(sock_path, fake_torch, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:True")
    with FakeDaemon(sock_path) as d:
        gpumon_client.attach(socket=sock_path)
        fake_torch.Optimizer().step()
        assert d.wait_for(2)[0]["expandable_segments"] is True


def test_reporter_shares_the_attached_session_and_hook_stands_down(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        gpumon_client.attach(socket=sock_path)
        opt = fake_torch.Optimizer()
        opt.step()
        r = gpumon_client.Reporter()
        for step in (10, 11):
            opt.step()
            r.report(step)
        r.close()  # attach() owns the session; no bye yet
        msgs = d.wait_for(4)
        assert [m["step"] for m in samples(msgs)] == [1, 10, 11]
        assert len(d.connections) == 1 and "bye" not in [m["type"] for m in msgs]


def test_reporter_for_manual_loops(sock_path, fake_torch):
    with FakeDaemon(sock_path) as d:
        with gpumon_client.Reporter("manual", socket=sock_path) as r:
            for step in range(3):
                r.report(step)
            with gpumon_client.phase("eval"):
                r.report(2)
        msgs = d.wait_for(1, type="bye")
        assert msgs[0]["job"] == "manual" and msgs[0]["gpu_uuid"].startswith("GPU-")
        assert [(m["step"], m["phase"]) for m in samples(msgs)] == [(0, "train"), (1, "train"), (2, "train"), (2, "eval")]
