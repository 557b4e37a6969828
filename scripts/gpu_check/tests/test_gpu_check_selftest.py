"""gpu-check without a GPU: the trainers' flags, and the whole driver end to end on CPU (trainers
with simulated allocator numbers, the daemon on the fake NVML library, nvidia-smi played by
tests/fake-nvidia-smi), so that a typo does not first show up on the GPU node.

Needs a python with torch (GPU_CHECK_TEST_PYTHON, e.g. `$(scripts/torch-venv newest)/bin/python`,
else the one running pytest) and `cargo build --workspace` (target/debug/gpumon and
target/debug/libfake_nvml.so); skips without them. The end-to-end run takes a few minutes on two
cores.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(PKG))
GPUMON = os.path.join(ROOT, "target", "debug", "gpumon")
FAKE_NVML = os.path.join(ROOT, "target", "debug", "libfake_nvml.so")
SCENARIO = os.path.join(ROOT, "crates", "fake-nvml", "scenarios", "two_gpus.toml")


def torch_python():
    """GPU_CHECK_TEST_PYTHON, else this python if it has torch (never installs anything)."""
    explicit = os.environ.get("GPU_CHECK_TEST_PYTHON")
    if explicit:
        return explicit
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    return sys.executable


@pytest.fixture(scope="module")
def python():
    py = torch_python()
    if not py or not os.path.exists(py):
        pytest.skip("no python with torch (set GPU_CHECK_TEST_PYTHON)")
    return py


# The self-test's batch-fit model and cap (as the driver passes them on CPU).
BATCH_FIT_CPU = ["--cap", "0.01", "--width", "32", "--seq", "16", "--layers", "2", "--heads", "2", "--vocab", "128", "--batch", "8"]


def env_for(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "clients", "python"), PKG] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("train_healthy.py", ["--seconds", "0"], "must be more than 0"),
        ("train_leak.py", ["--leak-rate", "1.5"], "must be below 1"),
        ("train_near_limit.py", ["--chunks", "0"], "--chunks must be 1 or more"),
        ("train_near_limit.py", ["--cap", "100"], "must be below the device"),
        ("train_oom.py", ["--cap", "abc"], "invalid float value"),
        ("train_ddp.py", ["--step-ms", "-1"], "must be more than 0"),
        ("bench_overhead.py", ["--sizes", "huge"], "--sizes: choose from small,large"),
        ("bench_overhead.py", ["--repeats", "0"], "--repeats must be 1 or more"),
        ("train_lightning.py", ["--device", "tpu"], "invalid choice"),
        ("train_hf.py", ["--frobnicate"], "unrecognized arguments"),
        ("train_batch_fit.py", [], "the following arguments are required: --mode"),
        ("train_batch_fit.py", ["--mode", "search", "--batch", "0"], "--batch must be 1 or more"),
        ("train_batch_fit.py", ["--mode", "predict", "--heads", "3"], "--width must be a multiple of --heads"),
        ("train_batch_fit.py", ["--mode", "search", "--cap", "100"], "must be below the device"),
    ],
)
def test_trainers_reject_bad_flags(python, script, args, message):
    r = subprocess.run(
        [python, os.path.join(PKG, script), "--device", "cpu"] + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env_for(),
        timeout=120,
    )
    assert r.returncode == 2, r.stdout.decode()
    assert message in r.stdout.decode()


def test_trainers_say_when_cuda_is_missing(python):
    r = subprocess.run(
        [python, os.path.join(PKG, "train_healthy.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env_for({"CUDA_VISIBLE_DEVICES": ""}),
        timeout=120,
    )
    assert r.returncode == 1 and "CUDA is not available" in r.stdout.decode()


@pytest.mark.parametrize(
    "script,args,keys",
    [
        ("train_healthy.py", ["--seconds", "1", "--width", "64"], {"steps", "seconds"}),
        ("train_leak.py", ["--seconds", "2", "--flat-seconds", "0.5", "--width", "64"], {"onset_step", "leak_bytes_per_step", "leaked_bytes"}),
        ("train_near_limit.py", ["--seconds", "1", "--cap", "0.03", "--width", "64"], {"cap", "steps"}),
        ("train_oom.py", ["--seconds", "10", "--cap", "0.05", "--chunk-mib", "8", "--warmup-steps", "2", "--after-steps", "2", "--step-ms", "5"], {"oom_step", "oom_message", "cap"}),
        ("train_batch_fit.py", ["--mode", "predict", "--seconds", "1"] + BATCH_FIT_CPU, {"peaks", "batch", "cap", "sim"}),
        ("train_batch_fit.py", ["--mode", "search", "--seconds", "60", "--also-try", "20"] + BATCH_FIT_CPU, {"largest", "smallest_failing", "tries"}),
    ],
)
def test_trainers_run_on_cpu_and_write_results(python, tmp_path, script, args, keys):
    result = tmp_path / "r.json"
    r = subprocess.run(
        [python, os.path.join(PKG, script), "--device", "cpu", "--result", str(result)] + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env_for(),
        timeout=120,
    )
    assert r.returncode == 0, r.stdout.decode()
    got = json.loads(result.read_text())
    assert keys <= set(got), got
    assert got.get("steps", 1) > 0
    if script == "train_oom.py":
        assert got["oom_step"] is not None and "simulated" in got["oom_message"]
    if got.get("mode") == "search":
        # The simulated allocator: the largest batch whose peak is under the cap, found by trying.
        assert got["complete"] and got["smallest_failing"] == got["largest"] + 1 > 8, got
        assert got["also_tried"] == dict(got["tries"][-1], batch=20) and got["also_tried"]["ok"]
        assert "simulated" in [t for t in got["tries"] if not t["ok"]][0]["error"]
    if got.get("mode") == "predict":
        assert len(got["peaks"]) == got["steps"] and set(got["peaks"]) == {got["sim"]["fixed"] + 8 * got["sim"]["per_sample"]}


def test_driver_rejects_bad_arguments(tmp_path):
    r = subprocess.run(
        [os.path.join(ROOT, "scripts", "gpu-check"), "--gpumon", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env_for({"PYTHON": sys.executable}),
        timeout=120,
    )
    assert r.returncode == 2 and "is not an executable file" in r.stdout.decode()
    r = subprocess.run(
        [sys.executable, os.path.join(PKG, "driver.py"), "--gpumon", "x", "--only", "leak,typo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=60,
    )
    assert r.returncode == 2 and "--only: unknown typo" in r.stdout.decode()


@pytest.mark.skipif(not (os.path.exists(GPUMON) and os.path.exists(FAKE_NVML)), reason="cargo build --workspace first")
def test_the_whole_check_on_cpu(python, tmp_path):
    out = tmp_path / "out"
    env = env_for(
        {
            "PYTHON": python,
            "FAKE_NVML_SCENARIO": SCENARIO,
            "GPU_CHECK_NVML_LIB": FAKE_NVML,
        }
    )
    argv = [
        os.path.join(ROOT, "scripts", "gpu-check"),
        "--gpumon", GPUMON,
        "--out", str(out),
        "--quick",
        "--device", "cpu",
        "--nvml-lib", FAKE_NVML,
        "--nvidia-smi", os.path.join(HERE, "fake-nvidia-smi"),
    ]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=900)
    text = r.stdout.decode()
    report = json.loads((out / "gpu-check.json").read_text())
    got = {c["name"]: c for c in report["checks"]}
    must_pass = [
        "daemon starts and sees the GPUs",
        "healthy trainer: sampled, no findings",
        "leak detected (step, growth)",
        "OOM reported against the allocator cap",
        "Lightning callback",
        "batch that fits: predicted vs found by trying",
        "daemon NVML poll vs bare NVML",
        "daemon log has no panic",
        "clean shutdown, nothing left running",
    ]
    for name in must_pass:
        assert got[name]["status"] == "pass", (name, got[name], text)
    # What a CPU cannot show fails, and so the run does: no trainer is an NVML process of the
    # fake library, and there are no allocator retries without an allocator.
    memory = got["per-process memory = nvidia-smi (MiB)"]
    assert memory["status"] == "fail" and " 0 trainer pids compared" in memory["figure"]
    assert "readings match (max diff 0 MiB)" in memory["figure"] and not memory["figure"].startswith("0/")
    assert got["near_limit fires and stays firing"]["status"] == "fail"
    assert r.returncode == 1, text
    assert got["client cost per ~0.4 ms step"]["status"] in ("pass", "fail")  # measured, noisy on CPU
    assert "0.4 ms" in (out / "gpu-check.md").read_text()
    for name in ("healthy", "leak", "oom", "near_limit", "batch_fit", "batch_fit_truth", "bench"):
        assert (out / "results" / ("%s.json" % name)).exists(), name
    assert any(f.endswith(".jsonl") for f in os.listdir(out / "traces"))


@pytest.mark.skipif(not os.path.exists(FAKE_NVML), reason="cargo build --workspace first")
def test_bare_nvml_reads_the_fake_library(monkeypatch):
    sys.path.insert(0, PKG)
    import nvml_bare

    monkeypatch.setenv("FAKE_NVML_SCENARIO", SCENARIO)
    nvml = nvml_bare.BareNvml(FAKE_NVML)
    try:
        assert nvml.count() == 2
        assert nvml.poll() > 0
        assert nvml.processes_seen == 4  # three compute processes and Xorg's graphics context
        procs = nvml_bare.compute_processes(nvml)
    finally:
        nvml.close()
    assert [(p, m) for p, _, m in procs] == [(4242, 1 << 30), (4243, 20 << 30), (5000, 40 << 30)]
    assert {u for _, u, _ in procs} == {"GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"}
    with pytest.raises(OSError):
        nvml_bare.BareNvml(os.path.join(PKG, "no-such-libnvidia-ml.so"))
