import os
import subprocess
import sys


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
        "gpumon: torch is not importable; nothing will be reported to gpumon (the script runs anyway)"]


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


def test_usage_error():
    proc = subprocess.run([sys.executable, "-m", "gpumon_client"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_parse():
    from gpumon_client.__main__ import _parse

    assert _parse(["run", "--job", "j", "t.py", "--job", "x"])["target"] == ["t.py", "--job", "x"]
    assert _parse(["run", "--every", "5", "-m", "pkg.train", "-v"])["module"] == "pkg.train"
    opts = _parse(["run", "--max-rate", "0", "--budget", "0.01", "t.py"])
    assert (opts["max_rate"], opts["budget"], opts["every"]) == (0.0, 0.01, 1)
    assert _parse(["run"]) is None and _parse(["run", "--bogus", "t.py"]) is None and _parse([]) is None
