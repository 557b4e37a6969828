import os
import subprocess
import sys
import time

import pytest

import gpumon_client
from gpumon_client import Client, StaticStatsSource, protocol
from gpumon_client.testing import FakeDaemon

import sample_stats

INFO = {"cuda_device": 0, "gpu_uuid": "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f", "torch": "2.5.1",
        "allocator": "native", "expandable_segments": False}


def source(**kw):
    return StaticStatsSource(sample_stats.STATS, (100, 200), INFO, **kw)


def test_import_does_not_pull_in_torch_or_frameworks():
    code = "import gpumon_client, sys; assert not {'torch', 'lightning', 'transformers'} & set(sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_sample_carries_known_keys_and_device_memory(sock_path):
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=source(), socket=sock_path, rank=3, world_size=8)
        c.sample(step=5)
        hello, sample = d.wait_for(2)
        expected = dict(protocol.hello(pid=os.getpid(), job="job-a", rank=3, world_size=8, **INFO))
        expected.update(caps=["ack"], instance=c.transport.instance)
        assert hello == expected
        assert sample["step"] == 5 and sample["phase"] == "train"
        assert set(sample["stats"]) == set(protocol.KNOWN_STATS_KEYS)
        assert "allocated_bytes.large_pool.current" not in sample["stats"]
        assert (sample["device_free"], sample["device_total"]) == (100, 200)
        c.close()


class GrowingCache(StaticStatsSource):
    """The allocator reserves 100 more bytes at every sample; the device's free memory, read
    once a second, is that of the first sample."""

    def __init__(self):
        super().__init__(dict(sample_stats.STATS), (10_000, 20_000), INFO)
        self.reserved = 1_000

    def memory_stats(self):
        self.reserved += 100
        return dict(sample_stats.STATS, **{"reserved_bytes.all.current": self.reserved})

    def mem_get_info(self):
        return (10_000 - (self.reserved - 1_100), 20_000)


def test_free_memory_follows_the_cache_between_device_reads(sock_path):
    # Free memory is read once a second; between reads it falls by what the cache reserved, so
    # the daemon's limit (free + reserved) stays the device's, not over it by the cache's growth.
    with FakeDaemon(sock_path) as d:
        c = Client("job-a", source=GrowingCache(), socket=sock_path)
        for step in range(1, 6):
            c.sample(step=step)
        samples = d.wait_for(6)[1:]
        limits = {s["device_free"] + s["stats"]["reserved_bytes.all.current"] for s in samples}
        assert limits == {11_100}, samples
        c.close()


def test_all_stats_keys_and_timer_samples(sock_path):
    with FakeDaemon(sock_path) as d:
        src = StaticStatsSource(sample_stats.STATS)  # no mem info, no device info
        c = Client(source=src, socket=sock_path, stats_keys=None)
        c.sample()
        hello, sample = d.wait_for(2)
        assert set(hello) == {"type", "v", "pid", "client", "caps", "instance"}
        assert sample["stats"] == sample_stats.STATS
        assert "step" not in sample and "device_free" not in sample


def test_labels_from_the_environment(sock_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("GPUMON_JOB", "from-env")
    with FakeDaemon(sock_path) as d:
        Client(source=source(), socket=sock_path).sample(step=1)
        hello = d.wait_for(2)[0]
        assert (hello["job"], hello["rank"], hello["world_size"]) == ("from-env", 2, 4)


def test_socket_from_environment(sock_path, monkeypatch):
    monkeypatch.setenv("GPUMON_SOCKET", sock_path)
    with FakeDaemon(sock_path) as d:
        Client(source=source()).sample(step=1)
        assert len(d.wait_for(2)) == 2


def test_a_failing_source_never_raises(sock_path):
    class Broken(StaticStatsSource):
        def memory_stats(self):
            raise RuntimeError("CUDA error")

        def device_info(self):
            raise RuntimeError("no device")

    with FakeDaemon(sock_path) as d:
        c = Client(source=Broken(), socket=sock_path)
        c.sample(step=1)
        c.mark("still alive")
        msgs = d.wait_for(2)
        assert msgs[-1]["detail"] == "still alive"
        assert c.stats()["internal_errors"] == 1


def test_events(sock_path):
    # An acking daemon, so every line is numbered: against one that is not, whether a line is
    # numbered depends on whether the welcome arrived before it was written.
    with FakeDaemon(sock_path, ack=True) as d:
        c = Client(source=source(), socket=sock_path)
        c.mark("lr drop", lr=0.1)
        c.snapshot("/var/lib/gpumon/snap.pickle")
        c.oom(2 * 1024**3, device_free=104857600, device=0)
        msgs = d.wait_for(4)[1:]
        assert msgs[0]["kind"] == "mark" and msgs[0]["lr"] == 0.1
        assert msgs[1] == {"type": "event", "ts": msgs[1]["ts"], "kind": "snapshot", "path": "/var/lib/gpumon/snap.pickle",
                           "seq": 2}
        assert msgs[2]["alloc_bytes"] == 2147483648 and msgs[2]["device_free"] == 104857600
        assert msgs[2]["detail"] == "CUDA out of memory on device 0. Tried to allocate 2.00 GiB"


def test_a_clients_samples_wait_for_the_next_write_and_close_writes_them(sock_path):
    with FakeDaemon(sock_path, ack=True) as d:
        c = Client(source=source(), socket=sock_path, write_every=60)
        c.sample(step=1)  # before the welcome: at once
        d.wait_for(2)
        deadline = time.monotonic() + 3
        while c.stats()["session"] is None and time.monotonic() < deadline:
            time.sleep(0.001)
        c.sample(step=2)
        c.sample(step=3)
        time.sleep(0.2)
        assert [m.get("step") for m in d.messages()] == [None, 1]  # 2 and 3 wait
        c.transport._last_write -= 60  # write_every has passed
        c.sample(step=4)
        assert [m["step"] for m in d.wait_for(5)[2:]] == [2, 3, 4]
        c.close()
        assert d.wait_for(6)[-1]["type"] == "bye"


def test_phase_context_manager(sock_path):
    with FakeDaemon(sock_path) as d:
        c = Client(source=source(), socket=sock_path)
        c.sample(step=1)
        with gpumon_client.phase("eval"):
            c.sample(step=1)
            with gpumon_client.phase("eval"):  # same phase: no extra events
                pass
        c.sample(step=2)
        msgs = d.wait_for(6)[1:]
        assert [(m["type"], m.get("phase")) for m in msgs] == [
            ("sample", "train"), ("event", "eval"), ("sample", "eval"), ("event", "train"), ("sample", "train")]


def test_disable_switch_makes_everything_a_no_op(sock_path, monkeypatch):
    monkeypatch.setenv("GPUMON_DISABLE", "1")
    with FakeDaemon(sock_path) as d:
        c = Client(source=source(), socket=sock_path)
        c.sample(step=1)
        c.mark("x")
        handle = gpumon_client.attach(socket=sock_path)
        assert handle.client is None and handle.reason == "" and "torch" not in sys.modules
        r = gpumon_client.Reporter(source=source(), socket=sock_path)
        r.report(1)
        with gpumon_client.phase("eval"):
            pass
        c.close()
        r.close()
        assert d.wait_for(1, timeout=0.2) == [] and not d.connections


def test_close_without_traffic_opens_no_session(sock_path):
    with FakeDaemon(sock_path) as d:
        Client(source=source(), socket=sock_path).close()
        assert not d.connections


def test_human_sizes():
    from gpumon_client.client import _human

    assert _human(512) == "512 bytes"
    assert _human(1536) == "1.50 KiB"
    assert _human(20 * 1024**4) == "20480.00 GiB"


def test_forked_child_opens_its_own_session(sock_path):
    with FakeDaemon(sock_path) as d:
        c = Client(source=source(), socket=sock_path)
        c.sample(step=1)
        d.wait_for(2)
        pid = os.fork()
        if pid == 0:  # child: report once on a fresh connection, then leave without cleanup
            try:
                c.sample(step=100)
                c.close(timeout=1.0)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        c.sample(step=2)
        c.close(timeout=1.0)
        d.wait_for(2, type="bye")
        by_conn = [[__import__("json").loads(x) for x in conn.lines] for conn in d.connections]
        assert len(by_conn) == 2
        parent = next(m for m in by_conn if m[0]["pid"] == os.getpid())
        child = next(m for m in by_conn if m[0]["pid"] == pid)
        assert [m.get("step") for m in parent if m["type"] == "sample"] == [1, 2]
        assert [m["type"] for m in child] == ["hello", "sample", "bye"] and child[1]["step"] == 100


def test_unclosed_clients_say_bye_at_exit(tmp_path, sock_path):
    code = (
        "from gpumon_client import Client, StaticStatsSource\n"
        "c = Client(source=StaticStatsSource({'num_ooms': 0}), socket=%r)\n"
        "c.sample(step=1)\n" % sock_path
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with FakeDaemon(sock_path) as d:
        subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=30)
        assert [m["type"] for m in d.wait_for(3)] == ["hello", "sample", "bye"]


def test_static_source_rejects_unknown_info_keys():
    with pytest.raises(ValueError, match=r"unknown info key\(s\) 'index', 'uuid'; the hello fields are cuda_device, gpu_uuid"):
        StaticStatsSource(info={"uuid": "GPU-1", "index": 0})


def test_alloc_limit_in_hello_then_only_when_it_changes(sock_path):
    src = StaticStatsSource({"num_ooms": 0}, (10, 100), {"alloc_limit": 50})
    with FakeDaemon(sock_path) as d:
        c = Client(source=src, socket=sock_path)
        ticks = iter(range(100))
        c._monotonic = lambda: float(next(ticks))  # one second per sample: the cap is re-read each time
        c.sample(step=1)
        c.sample(step=2)
        src.info["alloc_limit"] = 70
        c.sample(step=3)
        src.info["alloc_limit"] = None  # the cap lifted: the device total again, said once
        c.sample(step=4)
        c.sample(step=5)
        c.close()
        msgs = d.wait_for(7)
    assert msgs[0]["alloc_limit"] == 50
    assert [m.get("alloc_limit") for m in msgs[1:6]] == [50, None, 70, 100, None]


def test_stats_session_is_known_after_the_first_sample(sock_path):
    with FakeDaemon(sock_path, session="s-9") as d:
        c = Client(source=source(), socket=sock_path)
        c.sample(step=1)
        d.wait_for(2)
        deadline = time.time() + 2
        while c.stats()["session"] is None and time.time() < deadline:
            c.sample(step=2)
            time.sleep(0.01)
        assert c.stats()["session"] == "s-9"
        c.close()


DYING = """
import sys
from gpumon_client import Client, StaticStatsSource
c = Client("dies", source=StaticStatsSource({"num_ooms": 0}), socket=sys.argv[1])
c.sample(step=1)
if sys.argv[2] == "raise":
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


@pytest.mark.parametrize("how", ["raise", "return"])
def test_a_trainer_dying_of_an_exception_ends_without_bye(sock_path, tmp_path, how):
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with FakeDaemon(sock_path) as d:
        proc = subprocess.run([sys.executable, str(script), sock_path, how], env=dict(os.environ, PYTHONPATH=root),
                              capture_output=True, text=True, timeout=30)
        msgs = d.wait_for(3)
        time.sleep(0.2)
        msgs = d.messages()
    kinds = [(m["type"], m.get("kind")) for m in msgs]
    if how == "raise":
        assert proc.returncode == 1 and "RuntimeError: CUDA out of memory" in proc.stderr  # traceback kept
        assert kinds == [("hello", None), ("sample", None), ("event", "mark")]
        assert msgs[-1]["detail"] == "trainer died: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    else:
        assert proc.returncode == 0 and kinds == [("hello", None), ("sample", None), ("bye", None)]
