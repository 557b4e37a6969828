"""gpu-check: gpumon on real hardware, in one command (see docs/gpu-check.md).

    scripts/gpu-check --gpumon PATH/TO/gpumon [--out DIR] [--quick]

Starts the daemon on the real driver, runs real trainers on GPU 0 (healthy, leaking, near the
limit, out of memory, Lightning, Hugging Face, torchrun with 2 ranks, the batch that fits against
the largest found by trying, a cost benchmark), compares
what the daemon reports with nvidia-smi and with the trainers' own ground truth, and prints a table
of checks (also written as markdown and JSON to the output directory). Exits 1 when a check
fails, 2 when it could not run at all; every process it starts is ended on the way out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import analysis  # noqa: E402
import evaluate  # noqa: E402
import nvml_bare  # noqa: E402
import report  # noqa: E402
import snapshots  # noqa: E402
from daemon import Daemon, clean_env  # noqa: E402
from monitor import Monitor  # noqa: E402
from procs import Procs, wait_all  # noqa: E402

NAMES = ("healthy", "leak", "near_limit", "oom", "oom_patterns", "outside", "lightning", "hf", "ddp", "batch_fit", "bench")
# Seconds the leak trainer keeps leaking after its finding fired, at most, for its attribution.
ATTRIBUTION_WAIT_S = 30.0

# Seconds per trainer (full, quick). Trainers pace their steps, so these are wall times.
PLAN = {
    "full": {
        "healthy": 90, "leak": 120, "leak_flat": 10, "near_limit": 60, "oom": 30, "oom_patterns": 60, "outside": 60,
        "lightning_steps": 300, "hf_steps": 200, "ddp": 25, "bench_repeats": 30, "bench_seconds": 0.3,
        "batch_fit": 15, "batch_fit_search": 90, "batch_fit_timeout": 120,
        "phase_a": 200, "phase_b": 240, "bench_timeout": 240, "total": 1080,
    },
    "quick": {
        "healthy": 20, "leak": 60, "leak_flat": 6, "near_limit": 20, "oom": 20, "oom_patterns": 40, "outside": 45,
        "lightning_steps": 120, "hf_steps": 80, "ddp": 10, "bench_repeats": 8, "bench_seconds": 0.2,
        "batch_fit": 8, "batch_fit_search": 60, "batch_fit_timeout": 90,
        "phase_a": 120, "phase_b": 180, "bench_timeout": 150, "total": 600,
    },
}


class Interrupted(Exception):
    def __init__(self, why: str, status: int) -> None:
        super().__init__(why)
        self.why = why
        self.status = status


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu-check",
        description="Check gpumon on a real NVIDIA GPU: daemon, client, detectors, costs (docs/gpu-check.md).",
    )
    p.add_argument("--gpumon", required=True, help="the gpumon binary to test (built elsewhere: cargo build --release)")
    p.add_argument("--out", default="gpu-check-out", help="output directory (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="shorter runs: about 2 minutes instead of 4")
    p.add_argument("--python", default=sys.executable, help="python with torch for the trainers (default: this one)")
    p.add_argument("--only", help="comma-separated subset of: " + ",".join(NAMES))
    p.add_argument("--nvidia-smi", default=None, help="nvidia-smi command (default: from PATH)")
    p.add_argument("--interval", default="500ms", help="daemon NVML poll interval (default %(default)s)")
    # For the self-test on a machine without a GPU: trainers on CPU with injected allocator
    # numbers, the daemon on the fake NVML library (FAKE_NVML_SCENARIO in the environment).
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--nvml-lib", default=None, help="NVML library for the daemon and the bare timing (default: the driver's)")
    args = p.parse_args(argv)
    if args.only:
        chosen = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in chosen if n not in NAMES]
        if bad or not chosen:
            p.error("--only: unknown %s (choose from %s)" % (",".join(bad) or "(empty)", ",".join(NAMES)))
        args.selected = chosen
    else:
        args.selected = list(NAMES)
    return args


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.plan = PLAN["quick" if args.quick else "full"]
        self.out = os.path.abspath(args.out)
        self.workdir = tempfile.mkdtemp(prefix="gpumon-check-")
        self.procs = Procs()
        self.daemon: Optional[Daemon] = None
        self.monitor: Optional[Monitor] = None
        self.trainers: Dict[str, Dict[str, Any]] = {}
        self.context: Dict[str, Any] = {}
        self.obs: Dict[str, Any] = {}
        self.t0 = time.monotonic()
        self.bare: Any = None
        self.bare_error: Optional[str] = None
        self.smi: Optional[List[str]] = None

    # --- setup ---------------------------------------------------------------------------------

    def prepare_out(self) -> None:
        os.makedirs(self.out, exist_ok=True)
        for sub in ("traces", "results", "logs"):
            shutil.rmtree(os.path.join(self.out, sub), ignore_errors=True)
            os.makedirs(os.path.join(self.out, sub))
        for f in ("history.jsonl", "gpu-check.md", "gpu-check.json", "snapshot-final.json"):
            try:
                os.remove(os.path.join(self.out, f))
            except FileNotFoundError:
                pass

    def preflight(self) -> None:
        """Everything that makes the run pointless, checked before anything starts."""
        a = self.args
        if not (os.path.isfile(a.gpumon) and os.access(a.gpumon, os.X_OK)):
            raise SystemExit("gpu-check: --gpumon %s is not an executable file" % a.gpumon)
        if not shutil.which(a.python):
            raise SystemExit("gpu-check: --python %s not found" % a.python)
        if not os.path.isdir(os.path.join(ROOT, "clients", "python", "gpumon_client")):
            raise SystemExit("gpu-check: no clients/python/gpumon_client under %s" % ROOT)
        probe = subprocess.run(
            [a.python, "-c", "import sys, torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count(), sys.version.split()[0])"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=120,
            env=self.env(),
        )
        if probe.returncode != 0:
            raise SystemExit("gpu-check: %s cannot import torch:\n%s" % (a.python, probe.stderr.decode("utf-8", "replace")[-800:]))
        version, cuda, count, py = probe.stdout.decode().split()[-4:]
        if a.device == "cuda" and cuda != "True":
            raise SystemExit("gpu-check: torch %s in %s sees no CUDA device" % (version, a.python))
        self.context.update(torch=version, python=py, gpus_visible=count)
        version_out = subprocess.run([a.gpumon, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        self.context["gpumon"] = (version_out.stdout.decode("utf-8", "replace").strip().splitlines() or ["?"])[0]
        self.smi = [a.nvidia_smi] if a.nvidia_smi else ([shutil.which("nvidia-smi")] if shutil.which("nvidia-smi") else None)

    def env(self) -> Dict[str, str]:
        """The trainers' environment: the client from this checkout, the daemon under test."""
        env = clean_env(os.environ)
        paths = [os.path.join(ROOT, "clients", "python"), HERE]
        if self.args.device == "cpu":
            paths.insert(0, os.path.join(HERE, "sim"))
            env["GPU_CHECK_SIM"] = "1"
            env.setdefault("OMP_NUM_THREADS", "1")
            env["CUDA_VISIBLE_DEVICES"] = ""
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        # CUDA's device 0 is then NVML's GPU 0 (CUDA otherwise puts the fastest GPU first).
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        # Nothing is downloaded: the Hugging Face model is built from a config.
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if self.daemon is not None:
            env["GPUMON_SOCKET"] = self.daemon.socket
        return env

    def start_daemon(self) -> None:
        a = self.args
        self.daemon = Daemon(a.gpumon, self.workdir, self.out, interval=a.interval, nvml_lib=a.nvml_lib)
        try:
            ready = self.daemon.start(self.procs, dict(os.environ))
            self.obs["daemon"] = {"ready_s": ready}
        except RuntimeError as exc:
            self.obs["daemon"] = {"error": str(exc)}
            return
        try:
            self.bare = nvml_bare.BareNvml(a.nvml_lib or "libnvidia-ml.so.1")
        except Exception as exc:  # reported by the poll check
            self.bare_error = repr(exc)
        self.monitor = Monitor(self.daemon, self.smi, self.bare, os.path.join(self.out, "history.jsonl"))
        snap = self.monitor.observe()
        if a.device == "cpu" and snap and snap.get("gpus"):
            # The simulated trainers report the fake library's first GPU as theirs.
            os.environ["GPU_CHECK_SIM_UUID"] = snap["gpus"][0]["uuid"]
        gpus = (snap or {}).get("gpus") or []
        if gpus:
            self.context["gpu"] = "%s (%s), %d in the node" % (gpus[0].get("name"), analysis.fmt_bytes((gpus[0].get("memory") or {}).get("total")), len(gpus))
        self.context["driver"] = ((snap or {}).get("nvml") or {}).get("driver_version")

    # --- trainers ------------------------------------------------------------------------------

    def launch(self, name: str, argv: List[str], env: Optional[Dict[str, str]] = None) -> None:
        log = os.path.join(self.out, "logs", "%s.log" % name)
        full = self.env()
        full.update(env or {})
        self.trainers[name] = {"proc": self.procs.start(name, argv, log, env=full, cwd=self.workdir)}

    def first_gpu_only(self) -> Dict[str, str]:
        """GPU 0 alone: transformers' Trainer spreads over every visible GPU (DataParallel)."""
        if self.args.device != "cuda":
            return {}
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return {"CUDA_VISIBLE_DEVICES": visible.split(",")[0] if visible else "0"}

    def result_path(self, name: str) -> str:
        return os.path.join(self.out, "results", "%s.json" % name)

    def script(self, name: str) -> str:
        return os.path.join(HERE, name)

    def common(self, name: str, seconds: float) -> List[str]:
        return ["--device", self.args.device, "--seconds", str(seconds), "--result", self.result_path(name)]

    def run_launcher(self, name: str, script: str, seconds: float, extra: List[str]) -> None:
        job = evaluate.JOBS[name]
        argv = [self.args.python, "-m", "gpumon_client", "run", "--job", job]
        if self.args.device == "cpu":
            # Self-test: the simulated source reads /proc per sample and two cores run four
            # trainers, so the cost budget would leave the leak detector too few samples. The
            # rate limit (10/s) still applies; on a GPU the defaults are tested as they are.
            argv += ["--budget", "0"]
        argv.append(self.script(script))
        self.launch(name, argv + self.common(name, seconds) + extra)

    def has_module(self, *modules: str) -> bool:
        """Whether the trainers' python has any of `modules`."""
        code = "import importlib.util, sys; sys.exit(0 if any(importlib.util.find_spec(m) for m in sys.argv[1:]) else 3)"
        r = subprocess.run([self.args.python, "-c", code] + list(modules), timeout=60, env=self.env())
        return r.returncode == 0

    def phase_a(self) -> None:
        """Healthy, leak, near-limit and OOM trainers at once, nvidia-smi compared meanwhile."""
        p, sel, cpu = self.plan, self.args.selected, self.args.device == "cpu"
        stop_file = os.path.join(self.workdir, "leak.stop")
        if "healthy" in sel:
            self.run_launcher("healthy", "train_healthy.py", p["healthy"], ["--width", "256"] if cpu else [])
        if "leak" in sel:
            self.run_launcher("leak", "train_leak.py", p["leak"], ["--flat-seconds", str(p["leak_flat"]), "--stop-file", stop_file] + (["--width", "256"] if cpu else []))
        if "near_limit" in sel:
            self.run_launcher("near_limit", "train_near_limit.py", p["near_limit"], ["--cap", "0.0625", "--width", "256"] if cpu else [])
        if "oom" in sel:
            self.run_launcher("oom", "train_oom.py", p["oom"], ["--cap", "0.25", "--chunk-mib", "16"] if cpu else [])
        if "oom_patterns" in sel:
            if cpu:
                self.trainers["oom_patterns"] = {"skipped": "needs a GPU: real OOMs of the caching allocator"}
            else:
                self.run_launcher("oom_patterns", "train_oom_patterns.py", p["oom_patterns"], [])
        if "outside" in sel:
            if cpu:
                self.trainers["outside"] = {"skipped": "needs a GPU: device memory taken with cuMemAlloc"}
            else:
                self.run_launcher("outside", "train_outside.py", p["outside"], [])
        started = [t["proc"] for n, t in self.trainers.items()
                   if n in ("healthy", "leak", "near_limit", "oom", "oom_patterns", "outside") and "proc" in t]
        if not started:
            return
        leak_seen: List[float] = []
        # On a GPU the leak trainer also runs until its attribution is shown (the daemon asks as
        # soon as the finding is pending; a window is tens of 10 ms steps), or ATTRIBUTION_WAIT_S.
        wait_attribution = not cpu

        def tick() -> None:
            self.monitor.tick()
            if "leak" in self.trainers and not leak_seen and self.leak_firing():
                leak_seen.append(time.monotonic())
            if "leak" in self.trainers and "leak_attributed" not in self.obs:
                self.show_attribution()
            if not leak_seen or os.path.exists(stop_file):
                return
            firing_for = time.monotonic() - leak_seen[0]
            shown = "leak_attributed" in self.obs or not wait_attribution
            if firing_for > 3.0 and (shown or firing_for > ATTRIBUTION_WAIT_S):
                open(stop_file, "w").close()  # seen firing (and attributed) for a while: the leak trainer may stop

        self.monitor.compare = True
        try:
            self.wait(started, p["phase_a"], tick)
        finally:
            self.monitor.compare = False

    def show_attribution(self) -> None:
        """Prints the leak's attributed line the moment the daemon shows it (once)."""
        if not self.monitor.history:
            return
        snap = self.monitor.history[-1]
        for s in analysis.sessions_of_job(snap, evaluate.JOBS["leak"]):
            found = analysis.first_attributed([snap], s["session"])
            if found is None:
                continue
            line = analysis.attribution_line(found[1]["attribution"])
            self.obs["leak_attributed"] = {"ts": snap.get("ts"), "line": line}
            print("gpu-check: leak attributed live (%.0f s into the run): %s" % (time.monotonic() - self.t0, line), flush=True)
            return

    def leak_firing(self) -> bool:
        if not self.monitor.history:
            return False
        snap = self.monitor.history[-1]
        for s in analysis.sessions_of_job(snap, evaluate.JOBS["leak"]):
            if any(f.get("state") == "firing" for f in analysis.findings_of_session(snap, s["session"], "leak")):
                return True
        return False

    def phase_b(self) -> None:
        """The framework callbacks and torchrun, at once."""
        p, sel = self.plan, self.args.selected
        started = []
        if "lightning" in sel:
            if self.has_module("lightning", "pytorch_lightning"):
                self.launch("lightning", [self.args.python, self.script("train_lightning.py")] + self.common("lightning", 120) + ["--steps", str(p["lightning_steps"]), "--val-every", str(max(10, p["lightning_steps"] // 3))])
                started.append(self.trainers["lightning"]["proc"])
            else:
                self.trainers["lightning"] = {"skipped": "lightning is not installed for %s" % self.args.python}
        if "hf" in sel:
            if not self.has_module("transformers"):
                self.trainers["hf"] = {"skipped": "transformers is not installed for %s" % self.args.python}
            elif not self.has_module("accelerate"):
                self.trainers["hf"] = {"skipped": "transformers' Trainer needs accelerate, not installed for %s" % self.args.python}
            else:
                self.launch("hf", [self.args.python, self.script("train_hf.py")] + self.common("hf", 120) + ["--steps", str(p["hf_steps"]), "--eval-every", str(max(10, p["hf_steps"] // 3))], env=self.first_gpu_only())
                started.append(self.trainers["hf"]["proc"])
        if "ddp" in sel:
            argv = [
                self.args.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "gpumon_client", "run", "--job", evaluate.JOBS["ddp"], self.script("train_ddp.py"),
            ] + self.common("ddp", p["ddp"])
            self.launch("ddp", argv)
            started.append(self.trainers["ddp"]["proc"])
        if not started:
            return
        self.monitor.compare = True
        try:
            self.wait(started, p["phase_b"], self.monitor.tick)
        finally:
            self.monitor.compare = False

    def phase_batch_fit(self) -> None:
        """The batch that fits, alone on the GPU: a trainer attached to gpumon at one batch (the
        daemon predicts the largest safe batch from its split), then a fresh process without
        gpumon that finds the largest batch that really runs under the same cap, trying the
        prediction on its own at the end."""
        if "batch_fit" not in self.args.selected:
            return
        p, name = self.plan, "batch_fit"
        # On CPU a smaller model under a smaller (simulated) cap: the search runs real steps.
        extra = ["--cap", "0.01", "--width", "32", "--seq", "16", "--layers", "2", "--heads", "2",
                 "--vocab", "128", "--batch", "8"] if self.args.device == "cpu" else []
        script = [self.args.python, self.script("train_batch_fit.py")]
        self.launch(name, script + ["--mode", "predict", "--job", evaluate.JOBS[name]] + self.common(name, p["batch_fit"]) + extra)
        self.wait([self.trainers[name]["proc"]], p["batch_fit_timeout"], self.monitor.tick)
        view = evaluate.prediction_view(self.monitor.history, evaluate.JOBS[name]) or {}
        predicted = view.get("largest_safe_batch")
        also = ["--also-try", str(predicted)] if isinstance(predicted, int) and predicted > 0 else []
        truth = name + "_truth"
        self.launch(truth, script + ["--mode", "search"] + self.common(truth, p["batch_fit_search"]) + extra + also,
                    env={"GPUMON_DISABLE": "1"})
        self.wait([self.trainers[truth]["proc"]], p["batch_fit_search"] + 30, self.monitor.tick)

    def phase_bench(self) -> None:
        """The cost benchmark, alone on the GPU."""
        if "bench" not in self.args.selected:
            return
        p = self.plan
        self.launch("bench", [self.args.python, self.script("bench_overhead.py")] + self.common("bench", p["bench_seconds"]) + ["--repeats", str(p["bench_repeats"])])
        self.wait([self.trainers["bench"]["proc"]], p["bench_timeout"], self.monitor.tick)

    def wait(self, procs: List[Any], timeout: float, tick: Any) -> None:
        for p in wait_all(procs, timeout, tick=tick):
            p.timed_out = True
            self.procs.stop(p)
        for _ in range(4):  # let the daemon see the last samples and byes
            self.monitor.tick()
            time.sleep(0.5)
        self.monitor.observe()

    # --- gathering -----------------------------------------------------------------------------

    def timings(self) -> None:
        o = self.obs
        o["smi_times"] = nvml_bare.time_command(self.smi + ["--query-gpu=memory.used", "--format=csv,noheader"], 5) if self.smi else []
        try:
            o["pynvml_polls"] = nvml_bare.time_pynvml(20) if self.args.device == "cuda" else None
        except Exception as exc:
            o["pynvml_polls"] = []
            o["pynvml_error"] = repr(exc)

    def gather(self, shutdown: Dict[str, Any]) -> Dict[str, Any]:
        o = self.obs
        m = self.monitor
        o.update(
            history=m.history if m else [],
            metric_polls=m.metric_polls if m else [],
            bare_polls=m.bare_polls if m else [],
            bare_error=self.bare_error or (m.bare_error if m else None),
            comparisons=m.comparisons if m else [],
            smi_errors=m.smi_errors if m else [],
            smi=self.smi,
            shutdown=shutdown,
            not_selected=[n for n in NAMES if n not in self.args.selected],
        )
        o["trainers"] = {}
        for name, t in self.trainers.items():
            if "proc" not in t:
                o["trainers"][name] = dict(t)
                continue
            proc = t["proc"]
            entry = {"rc": proc.poll(), "timed_out": proc.timed_out, "log_tail": proc.log_tail(), "result": None}
            path = self.result_path(name)
            if name == "ddp":
                path = self.result_path("ddp.rank0")
            try:
                with open(path) as f:
                    entry["result"] = json.load(f)
            except (OSError, ValueError):
                pass
            o["trainers"][name] = entry
        o["traces"] = self.trace_summaries(o["history"])
        try:
            with open(self.daemon.log_path, "rb") as f:
                o["daemon_log"] = f.read()[-2_000_000:].decode("utf-8", "replace")
        except (OSError, AttributeError):
            o["daemon_log"] = ""
        if m and m.last_full:
            with open(os.path.join(self.out, "snapshot-final.json"), "w") as f:
                json.dump(m.last_full, f, indent=1)
        return o

    def trace_summaries(self, history: List[Dict[str, Any]]) -> Dict[str, Any]:
        out = {}
        tdir = os.path.join(self.out, "traces")
        files = os.listdir(tdir) if os.path.isdir(tdir) else []
        for key in ("lightning", "hf"):
            for s in analysis.latest_sessions(history, evaluate.JOBS[key]):
                for fname in sorted(files):
                    if "-%s-" % s["session"] in fname and fname.endswith(".jsonl"):
                        with open(os.path.join(tdir, fname), encoding="utf-8", errors="replace") as f:
                            out[s["session"]] = analysis.trace_summary(analysis.read_trace(f.read()))
        return out

    def stop_daemon(self) -> Dict[str, Any]:
        if self.daemon is None or self.daemon.proc is None:
            return {"rc": None, "seconds": 0.0, "leftovers": []}
        for p in self.procs.procs:  # trainers first (all should have ended by now)
            if p is not self.daemon.proc:
                self.procs.stop(p)
        t0 = time.monotonic()
        rc = self.procs.stop(self.daemon.proc, grace=10.0)
        seconds = time.monotonic() - t0
        ended = self.procs.stop_all()
        return {"rc": rc, "seconds": seconds, "leftovers": ended + ["pgid %d" % g for g in self.procs.leftovers()]}

    def cleanup(self) -> None:
        self.procs.stop_all()
        if self.bare is not None:
            self.bare.close()
            self.bare = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the run -------------------------------------------------------------------------------

    def execute(self) -> int:
        self.preflight()
        self.prepare_out()
        self.context.update(
            date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            host=socket.gethostname(),
            mode=("quick" if self.args.quick else "full") + ("" if self.args.device == "cuda" else ", CPU self-test"),
        )
        self.start_daemon()
        if self.daemon is not None and "error" not in self.obs["daemon"]:
            self.phase_a()
            self.phase_b()
            self.phase_batch_fit()
            self.phase_bench()
            self.timings()
        shutdown = self.stop_daemon()
        obs = self.gather(shutdown)
        checks = with_attribution(evaluate.evaluate(obs), obs, self.args.device == "cpu")
        # Snapshot pairs of leak patterns the shared fixtures do not cover, diffed offline.
        checks += snapshots.run_all(
            self.args.python, os.path.join(self.out, "snapshots"), self.env(),
            skip=None if self.args.device == "cuda" else "needs CUDA (CPU self-test)")
        return self.finish(checks)

    def report_interrupted(self, why: str) -> None:
        """What can be judged of a run cut short, with the interruption as a failed check."""
        checks = [report.Check("gpu-check ran to the end", report.FAIL, why)]
        try:
            if self.obs.get("daemon"):
                obs = self.gather({"rc": None, "seconds": 0.0, "leftovers": ["pgid %d" % g for g in self.procs.leftovers()]})
                checks += with_attribution(evaluate.evaluate(obs), obs, self.args.device == "cpu")
        except Exception as exc:  # a partial run may lack anything; the interruption is the news
            checks.append(report.Check("partial results", report.SKIP, "could not be evaluated: %r" % (exc,)))
        try:
            self.finish(checks)
        except OSError as exc:
            sys.stderr.write("gpu-check: could not write the report: %s\n" % exc)

    def finish(self, checks: List[report.Check], notes: Optional[List[str]] = None) -> int:
        self.context["duration"] = "%.0f s" % (time.monotonic() - self.t0)
        os.makedirs(self.out, exist_ok=True)
        print(report.table(checks))
        md = report.markdown(checks, self.context, notes)
        with open(os.path.join(self.out, "gpu-check.md"), "w") as f:
            f.write(md)
        measurements = {k: self.obs.get(k) for k in ("metric_polls", "bare_polls", "smi_times", "pynvml_polls", "comparisons")}
        measurements["trainers"] = {k: v.get("result") for k, v in (self.obs.get("trainers") or {}).items()}
        try:  # predicted and real batch, their error, the split against the allocator's peak
            facts = evaluate.batch_fit_facts(self.obs) if self.obs.get("trainers") else None
            measurements["batch_fit"] = dict(facts["figures"], fails=facts["fails"]) if facts else None
        except Exception as exc:  # a partial run may lack anything
            measurements["batch_fit"] = {"error": repr(exc)}
        with open(os.path.join(self.out, "gpu-check.json"), "w") as f:
            f.write(report.as_json(checks, self.context, measurements))
        print("\nwritten: %s (markdown), %s, logs/, traces/" % (os.path.join(self.out, "gpu-check.md"), os.path.join(self.out, "gpu-check.json")))
        return report.exit_status(checks)


ATTRIBUTION_CHECK = "leak attributed live (file:line)"


def attribution_check(obs: Dict[str, Any], cpu: bool) -> Optional[report.Check]:
    """Whether the leak finding named the leaking trainer's line while it ran; None when the leak
    trainer was not selected."""
    if "leak" in obs.get("not_selected", ()):
        return None
    t = (obs.get("trainers") or {}).get("leak") or {}
    sessions = analysis.latest_sessions(obs.get("history") or [], evaluate.JOBS["leak"])
    if not sessions or t.get("result") is None:
        return report.Check(ATTRIBUTION_CHECK, report.FAIL, "no leak session or no result file to judge")
    status, figure = analysis.attribution_verdict(obs["history"], sessions[-1], t["result"], cpu=cpu)
    live = (obs.get("leak_attributed") or {}).get("line")
    return report.Check(ATTRIBUTION_CHECK, status, figure, "printed live: %s" % live if live else "")


def with_attribution(checks: List[report.Check], obs: Dict[str, Any], cpu: bool) -> List[report.Check]:
    """`checks` with the attribution check right after the leak check."""
    extra = attribution_check(obs, cpu)
    if extra is None:
        return checks
    names = [c.name for c in checks]
    at = names.index("leak detected (step, growth)") + 1 if "leak detected (step, growth)" in names else len(checks)
    return checks[:at] + [extra] + checks[at:]


def _raise(signum: int, _frame: Any) -> None:
    if signum == signal.SIGALRM:
        raise Interrupted("gave up: the run took longer than its overall limit (watchdog)", 3)
    raise Interrupted("interrupted by %s" % signal.Signals(signum).name, 128 + signum)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    # SIGALRM is the last line of defence against a hang: every wait has its own timeout, the
    # alarm bounds them all.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, _raise)
    signal.alarm(int(run.plan["total"]))
    try:
        return run.execute()
    except Interrupted as exc:
        signal.alarm(0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # cleaning up now; a second ^C must not cut it short
        run.cleanup()
        sys.stderr.write("gpu-check: %s; every process it started was stopped\n" % exc.why)
        run.report_interrupted(exc.why)
        return exc.status
    except SystemExit as exc:
        signal.alarm(0)
        run.cleanup()
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
            return 2
        return int(exc.code or 0)
    except Exception as exc:  # a bug or a broken node: still stop everything and say what ran
        signal.alarm(0)
        run.cleanup()
        traceback.print_exc()
        run.report_interrupted("gpu-check itself failed: %r" % (exc,))
        return 2
    finally:
        signal.alarm(0)
        run.cleanup()


if __name__ == "__main__":
    sys.exit(main())
