import os
import subprocess
import sys
import textwrap

from gpumon_client.testing import FakeDaemon

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# A torch package for the child process: the tests' fake, importable as `torch`.
FAKE_PKG = "import sys, fake_torch\nsys.modules['torch'] = fake_torch.make()\n"

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    opt = torch.Optimizer()
    for _ in range(int(sys.argv[1])):
        opt.step()
    print("argv", sys.argv[1:], "name", __name__)
    sys.exit(int(sys.argv[2]))
    """
)


def run(tmp_path, sock_path, *args, env=None):
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_PKG)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    full_env = dict(os.environ, GPUMON_SOCKET=sock_path,
                    PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), HERE, ROOT]))
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpumon_client", "run", *[str(script) if a == "SCRIPT" else a for a in args]],
        env=full_env, capture_output=True, text=True, timeout=30,
    )


def test_run_attaches_to_an_unmodified_script(tmp_path, sock_path):
    with FakeDaemon(sock_path) as d:
        proc = run(tmp_path, sock_path, "--job", "cli", "SCRIPT", "3", "0", env={"RANK": "1"})
        assert proc.returncode == 0, proc.stderr
        assert "argv ['3', '0'] name __main__" in proc.stdout
        msgs = d.wait_for(5)
        assert [m["type"] for m in msgs] == ["hello", "sample", "sample", "sample", "bye"]
        assert msgs[0]["job"] == "cli" and msgs[0]["rank"] == 1 and msgs[0]["pid"] != os.getpid()


def test_run_keeps_the_exit_status_and_survives_no_daemon(tmp_path, sock_path):
    proc = run(tmp_path, sock_path, "SCRIPT", "2", "7")
    assert proc.returncode == 7, proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_disabled(tmp_path, sock_path):
    with FakeDaemon(sock_path) as d:
        proc = run(tmp_path, sock_path, "SCRIPT", "2", "0", env={"GPUMON_DISABLE": "1"})
        assert proc.returncode == 0
        assert not d.connections


def test_run_module(tmp_path, sock_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "mytrain.py").write_text("import sys\nprint('mod', sys.argv)\n")
    env = dict(os.environ, GPUMON_SOCKET=sock_path, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))
    proc = subprocess.run([sys.executable, "-m", "gpumon_client", "run", "-m", "mytrain", "--lr", "3"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("mod [") and proc.stdout.rstrip().endswith("'--lr', '3']")


def test_usage_error():
    proc = subprocess.run([sys.executable, "-m", "gpumon_client"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_parse():
    from gpumon_client.__main__ import _parse

    assert _parse(["run", "--job", "j", "t.py", "--job", "x"])["target"] == ["t.py", "--job", "x"]
    assert _parse(["run", "--every", "5", "-m", "pkg.train", "-v"])["module"] == "pkg.train"
    assert _parse(["run"]) is None and _parse(["run", "--bogus", "t.py"]) is None and _parse([]) is None
