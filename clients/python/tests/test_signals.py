"""A stop signal is told to the daemon, then the trainer's own disposition runs: the default
action (the process dies of the signal), the trainer's handler, Python's KeyboardInterrupt.
Real processes, real signals, the client's real socket to a fake daemon."""

import os
import signal
import subprocess
import sys
import time

import pytest

from gpumon_client.testing import FakeDaemon

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAINER = """
import signal, sys, time
from gpumon_client import Client, StaticStatsSource
how = sys.argv[2]
if how == "own":
    def own(signum, frame):
        print("own handler ran", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, own)
c = Client("stops", source=StaticStatsSource({"num_ooms": 0}), socket=sys.argv[1], write_every=0)
if how == "own-after":
    def own(signum, frame):
        print("own handler ran", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, own)
c.sample(step=1)
print("ready", flush=True)
step = 2
while True:
    time.sleep(0.01)
    c.sample(step=step)
    step += 1
"""


def signals_default():
    # A suite started in the background by a shell inherits SIGINT ignored (Python then
    # installs no KeyboardInterrupt handler), and one started under nohup SIGHUP ignored: the
    # trainer is started as a terminal would start it.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def run(sock_path, tmp_path, how, sig):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    with FakeDaemon(sock_path) as d:
        proc = subprocess.Popen([sys.executable, str(script), sock_path, how], env=dict(os.environ, PYTHONPATH=ROOT),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=signals_default)
        assert proc.stdout.readline().strip() == "ready"
        d.wait_for(2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        time.sleep(0.2)
        msgs = d.messages()
    marks = [m for m in msgs if m.get("kind") == "mark"]
    return proc.returncode, out, err, marks, msgs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_default_signal_is_told_then_kills_the_process_as_it_would_have(sock_path, tmp_path, sig):
    code, _, _, marks, msgs = run(sock_path, tmp_path, "plain", sig)
    assert code == -sig  # died of the signal itself: the default action ran
    name = signal.Signals(sig).name
    assert marks and marks[0]["ending"] == "signal" and marks[0]["signal"] == name
    assert marks[0]["detail"] == "trainer got %s" % name
    assert all(m["type"] != "bye" for m in msgs)


def test_ctrl_c_is_told_and_still_raises_keyboard_interrupt(sock_path, tmp_path):
    code, _, err, marks, msgs = run(sock_path, tmp_path, "plain", signal.SIGINT)
    assert "KeyboardInterrupt" in err  # Python's own handler ran: the traceback is there
    assert code != 0
    assert [m["signal"] for m in marks] == ["SIGINT", "SIGINT"]
    assert marks[1]["detail"].startswith("trainer died: KeyboardInterrupt")
    assert all(m["type"] != "bye" for m in msgs)


@pytest.mark.parametrize("how", ["own", "own-after"])
def test_the_trainers_own_handler_runs(sock_path, tmp_path, how):
    code, out, _, marks, msgs = run(sock_path, tmp_path, how, signal.SIGTERM)
    assert "own handler ran" in out and code == 7
    if how == "own":
        # Chained: told first, then the trainer's handler, which exits cleanly (bye).
        assert marks[0]["signal"] == "SIGTERM"
    else:
        # Set after the client: it replaced ours, as is its right; nothing is told.
        assert not marks
    assert msgs[-1]["type"] == "bye"


def test_an_ignored_signal_stays_ignored(sock_path, tmp_path):
    script = tmp_path / "ignored.py"
    script.write_text(
        "import signal, sys\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "from gpumon_client import Client, StaticStatsSource\n"
        "c = Client('x', source=StaticStatsSource({}), socket=sys.argv[1])\n"
        "print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)\n"
    )
    out = subprocess.run([sys.executable, str(script), sock_path], env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=30).stdout
    assert out.strip() == "True"


def test_an_uncaught_exception_says_its_type(sock_path, tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(
        "import sys\n"
        "from gpumon_client import Client, StaticStatsSource\n"
        "c = Client('x', source=StaticStatsSource({}), socket=sys.argv[1])\n"
        "c.sample(step=1)\n"
        "raise ValueError('bad batch ' + 'x' * 1000)\n"
    )
    with FakeDaemon(sock_path) as d:
        subprocess.run([sys.executable, str(script), sock_path], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=30)
        d.wait_for(3)
        time.sleep(0.2)
        marks = [m for m in d.messages() if m.get("kind") == "mark"]
    assert marks[-1]["ending"] == "exception" and marks[-1]["exception"] == "ValueError"
    assert marks[-1]["detail"].startswith("trainer died: ValueError: bad batch") and len(marks[-1]["detail"]) <= 400


def test_gpumon_signals_0_installs_no_handler(sock_path, tmp_path):
    script = tmp_path / "off.py"
    script.write_text(
        "import signal, sys\n"
        "from gpumon_client import Client, StaticStatsSource\n"
        "c = Client('x', source=StaticStatsSource({}), socket=sys.argv[1])\n"
        "print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)\n"
    )
    for value, untouched in (("0", "True"), ("", "False")):
        env = dict(os.environ, PYTHONPATH=ROOT, GPUMON_SIGNALS=value)
        out = subprocess.run([sys.executable, str(script), sock_path], env=env, capture_output=True, text=True,
                             timeout=30).stdout
        assert out.strip() == untouched, value
