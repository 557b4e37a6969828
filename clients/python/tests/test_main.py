import os
import subprocess
import sys

import pytest


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SCRIPT = "import sys\nprint('argv', sys.argv[1:], 'name', __name__)\nsys.exit(int(sys.argv[1]))\n"


def run(tmp_path, *args, env=None):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    full_env = dict(os.environ, PYTHONPATH=ROOT)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpumon_client", "run", *[str(script) if a == "SCRIPT" else a for a in args]],
        env=full_env, capture_output=True, text=True, timeout=30,
    )


# The launcher with real torch (samples, argv, exit status, -m, torchrun) is tested in tests_torch/;
# here, with no torch installed, what it says and does when there is nothing to report.
def test_without_torch_it_says_nothing_will_be_reported_and_runs_the_script(tmp_path):
    proc = run(tmp_path, "SCRIPT", "3", "x", env={"GPUMON_SOCKET": str(tmp_path / "none.sock")})
    assert proc.returncode == 3
    assert proc.stdout == "argv ['3', 'x'] name __main__\n"
    assert proc.stderr.splitlines() == [
        "gpumon: torch is not importable; nothing will be reported to gpumon (training continues)"]


def test_disabled_is_silent(tmp_path):
    proc = run(tmp_path, "SCRIPT", "0", env={"GPUMON_DISABLE": "1"})
    assert proc.returncode == 0 and proc.stderr == ""


def test_missing_script_is_one_line_like_python(tmp_path):
    proc = run(tmp_path, str(tmp_path / "nope.py"))
    assert proc.returncode == 2
    assert proc.stderr == "python -m gpumon_client run: can't open file %r: [Errno 2] No such file or directory\n" % str(
        tmp_path / "nope.py")


def test_bad_option_value_names_it(tmp_path):
    proc = run(tmp_path, "--budget", "2", "SCRIPT", "0")
    assert proc.returncode == 2
    assert proc.stderr.startswith("python -m gpumon_client run: gpumon: budget=2.0: must be a share of step time")
    proc = run(tmp_path, "--every", "often", "SCRIPT", "0")
    assert proc.returncode == 2 and "invalid literal for int() with base 10: 'often'" in proc.stderr


def cli(*args):
    return subprocess.run([sys.executable, "-m", "gpumon_client", *args], cwd=ROOT, capture_output=True, text=True)


def test_usage_error():
    proc = cli()
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_help_goes_to_stdout_and_explains_every_option():
    for args in (["--help"], ["-h"], ["help"], ["run", "--help"]):
        proc = cli(*args)
        assert (proc.returncode, proc.stderr) == (0, ""), args
        for opt in ("--job NAME", "--socket PATH", "--every N", "--max-rate R", "--budget F", "diff", "explain"):
            assert opt in proc.stdout, (args, opt)
    assert "GPUMON_SOCKET" in cli("--help").stdout


def test_an_unknown_command_or_option_is_named():
    proc = cli("runn", "train.py")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "python -m gpumon_client: unknown command 'runn' (commands: run, diff, explain)\n"), proc.stderr
    proc = cli("run", "--bogus", "train.py")
    assert proc.returncode == 2 and proc.stderr.startswith("python -m gpumon_client run: unknown option --bogus\n")
    proc = cli("run", "--job")
    assert proc.returncode == 2 and proc.stderr.startswith("python -m gpumon_client run: --job needs a value\n")


def test_parse():
    from gpumon_client.__main__ import _parse

    assert _parse(["run", "--job", "j", "t.py", "--job", "x"])["target"] == ["t.py", "--job", "x"]
    assert _parse(["run", "--every", "5", "-m", "pkg.train", "-v"])["module"] == "pkg.train"
    opts = _parse(["run", "--max-rate", "0", "--budget", "0.01", "t.py"])
    assert (opts["max_rate"], opts["budget"], opts["every"], opts["write_every"]) == (0.0, 0.01, 1, 0.5)
    assert _parse(["run", "--write-every", "0", "t.py"])["write_every"] == 0.0
    assert _parse(["run"]) is None and _parse([]) is None
    with pytest.raises(ValueError, match="unknown option --bogus"):
        _parse(["run", "--bogus", "t.py"])


def test_attach_says_once_on_stderr_why_nothing_will_be_reported():
    code = (
        "import gpumon_client as g\n"
        "a = g.attach(job='j')\n"
        "b = g.attach(job='j')\n"
        "print(a.client is None, a.reason)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True torch is not importable\n"
    assert proc.stderr.splitlines() == [
        "gpumon: torch is not importable; nothing will be reported to gpumon (training continues)"]
