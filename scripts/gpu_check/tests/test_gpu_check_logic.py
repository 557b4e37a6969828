"""gpu-check's parsing, comparisons, verdicts and report, on synthetic inputs (no GPU, no torch):
`python3 -m pytest -q scripts/gpu_check/tests`."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import analysis as a  # noqa: E402
import evaluate as ev  # noqa: E402
import report  # noqa: E402

MIB, GIB = a.MIB, a.GIB
UUID = "GPU-11111111-2222-3333-4444-555555555555"


# --- formatting and parsing ----------------------------------------------------------------------


def test_fmt_bytes_spells_sizes_like_the_daemon():
    assert a.fmt_bytes(512) == "512 B"
    assert a.fmt_bytes(64 * MIB) == "64.0 MiB"
    assert a.fmt_bytes(int(1.5 * GIB)) == "1.5 GiB"
    assert a.fmt_bytes(int(1.5 * GIB), 2) == "1.50 GiB"
    assert a.fmt_bytes(-2 * GIB) == "-2.0 GiB"
    assert a.fmt_bytes(None) == "n/a"


def test_smi_rows_parse_with_and_without_uuid_and_na():
    text = "4242, %s, 1024\n4243, %s, [N/A]\n\n" % (UUID, UUID)
    rows = a.parse_smi_compute_apps(text)
    assert rows == [
        {"pid": 4242, "gpu_uuid": UUID, "used_mib": 1024},
        {"pid": 4243, "gpu_uuid": UUID, "used_mib": None},
    ]
    assert a.parse_smi_compute_apps("17, 300") == [{"pid": 17, "gpu_uuid": None, "used_mib": 300}]
    assert a.parse_smi_compute_apps("No running processes found\n") == []


def test_smi_garbage_is_an_error_naming_the_line():
    with pytest.raises(ValueError, match="Failed to initialize"):
        a.parse_smi_compute_apps("Failed to initialize NVML: Driver/library version mismatch")


def test_metrics_parse_labels_and_plain_series():
    text = "\n".join(
        [
            "# HELP gpumon_nvml_poll_duration_seconds x",
            "gpumon_nvml_poll_duration_seconds 0.0012",
            "gpumon_nvml_polls_total 17",
            'gpumon_process_memory_used_bytes{gpu="0",uuid="GPU-1",pid="42",process="py",container=""} 1048576',
            "not a metric line {",
        ]
    )
    m = a.parse_metrics(text)
    assert a.metric_value(m, "gpumon_nvml_polls_total") == 17
    assert a.metric_value(m, "gpumon_nvml_poll_duration_seconds") == 0.0012
    labels, value = m["gpumon_process_memory_used_bytes"][0]
    assert labels["pid"] == "42" and labels["container"] == "" and value == 1048576
    assert a.metric_value(m, "gpumon_absent") is None


def test_distinct_polls_count_each_poll_once():
    obs = [(1, 0.001), (1, 0.001), (2, 0.003), (None, 0.5), (3, None), (4, 0.002)]
    assert a.distinct_polls(obs) == [0.001, 0.003, 0.002]


def test_percentile_and_median():
    xs = [5, 1, 4, 2, 3]
    assert a.median(xs) == 3
    assert a.percentile(xs, 95) == 5
    assert a.percentile(xs, 20) == 1
    assert a.median([]) is None and a.percentile([], 50) is None


# --- comparisons -----------------------------------------------------------------------------------


def snap(procs, ts=0.0):
    return {"ts": ts, "processes": [{"pid": p, "uuid": UUID, "used_memory_bytes": b} for p, b in procs.items()]}


def test_memory_matches_to_the_mib_and_flags_the_rest():
    before = snap({1: 1024 * MIB, 2: 300 * MIB, 3: 50 * MIB, 5: 10 * MIB})
    after = snap({1: 1024 * MIB, 2: 302 * MIB, 3: 50 * MIB, 5: 10 * MIB})
    rows = [
        {"pid": 1, "gpu_uuid": UUID, "used_mib": 1024},  # match
        {"pid": 2, "gpu_uuid": UUID, "used_mib": 301},  # daemon moved meanwhile: unstable
        {"pid": 3, "gpu_uuid": UUID, "used_mib": 53},  # 3 MiB apart: mismatch
        {"pid": 4, "gpu_uuid": UUID, "used_mib": 9},  # the daemon never listed it
        {"pid": 9, "gpu_uuid": "GPU-other", "used_mib": 1},  # another GPU: ignored
    ]
    xorg = {"pid": 6, "uuid": UUID, "kind": "graphics", "used_memory_bytes": 16 * MIB}
    before["processes"].append(xorg)
    after["processes"].append(xorg)
    got = {c["pid"]: c["status"] for c in a.compare_process_memory(before, rows, after, UUID)}
    assert got == {1: "match", 2: "unstable", 3: "mismatch", 4: "missing", 5: "not_in_smi"}


def test_memory_verdict_needs_a_trainer_and_no_mismatch():
    match = {"pid": 1, "status": "match", "diff_mib": 0}
    ok, figure = a.memory_verdict([match], trainer_pids=[1])
    assert ok and "1/1 readings match" in figure
    assert not a.memory_verdict([match], trainer_pids=[7])[0]  # no trainer compared
    assert not a.memory_verdict([match, {"pid": 2, "status": "mismatch", "diff_mib": 4}], [1])[0]
    assert not a.memory_verdict([match, {"pid": 3, "status": "missing"}], [1])[0]
    assert not a.memory_verdict([], [1])[0]


# --- findings over time ----------------------------------------------------------------------------


def finding(session, kind, state, fid=None, **extra):
    f = {"id": fid or "%s/%s" % (session, kind), "session": session, "kind": kind, "state": state}
    f.update(extra)
    return f


def test_episodes_count_raises_and_resolutions_while_live():
    tl = [
        (1.0, "s-1/near_limit", "pending"),
        (2.0, "s-1/near_limit", "firing"),
        (3.0, "s-1/near_limit", "firing"),
        (4.0, "s-1/near_limit", "resolved"),
        (5.0, "s-1/near_limit#2", "firing"),
        (9.0, "s-1/near_limit#2", "resolved"),  # after the session ended: not counted as live
    ]
    e = a.episodes(tl, live_until=8.0)
    assert e["raised"] == 2 and e["resolved_while_live"] == 1 and e["ever_firing"]
    assert e["firing_share"] == pytest.approx(3 / 4)
    steady = a.episodes([(1.0, "x", "firing"), (2.0, "x", "firing"), (3.0, "x", "resolved")], live_until=2.5)
    assert steady == {"raised": 1, "resolved_while_live": 0, "firing_share": 1.0, "ever_firing": True}
    assert not a.episodes([], None)["ever_firing"]


def test_first_observed_and_latest_sessions():
    h = [
        {"ts": 1.0, "sessions": [{"session": "s-2", "job": "j", "samples": 1}], "findings": [finding("s-2", "leak", "pending")]},
        {"ts": 2.0, "sessions": [{"session": "s-2", "job": "j", "samples": 5}, {"session": "s-10", "job": "j"}], "findings": [finding("s-2", "leak", "firing", first_step=7)]},
    ]
    snap_, f = a.first_observed(h, "s-2", "leak")
    assert snap_["ts"] == 2.0 and f["first_step"] == 7
    assert a.first_observed(h, "s-2", "oom") is None
    latest = a.latest_sessions(h, "j")
    assert [s["session"] for s in latest] == ["s-2", "s-10"] and latest[0]["samples"] == 5


def test_leak_verdict_judges_against_the_ground_truth():
    trainer = {"onset_step": 500, "onset_ts": 100.0, "leak_bytes_per_step": 2 * MIB, "steps": 2000}
    f = finding("s-1", "leak", "firing", first_step=700, evidence={"growth_bytes": 380 * MIB})
    ok, figure = a.leak_verdict(f, 120.0, trainer, 80 * GIB)
    assert ok, figure
    assert "first step 700 (onset 500, +200 steps)" in figure and "20.0 s after onset" in figure
    early = finding("s-1", "leak", "firing", first_step=400, evidence={})
    ok, figure = a.leak_verdict(early, 120.0, trainer, 80 * GIB)
    assert not ok and "BEFORE" in figure
    late = finding("s-1", "leak", "firing", first_step=500 + 3000, evidence={})
    ok, figure = a.leak_verdict(late, 120.0, trainer, 80 * GIB)  # 6000 MiB > max(2 GiB, 2.4 GiB)
    assert not ok and "over the allowed" in figure
    assert not a.leak_verdict(None, None, trainer, 80 * GIB)[0]


def attributed(line=17, error=None):
    if error:
        return {"id": 1, "ts": 19.0, "error": error, "detail": "CUDA is not available to torch 2.5.1", "total_growth_bytes": 0, "sites": []}
    site = {"file": "/home/a/gpumon/scripts/gpu_check/train_leak.py", "line": line, "function": "step_output",
            "bytes": 30 * MIB, "blocks": 48, "stack": []}
    return {"id": 1, "ts": 19.0, "step_from": 1210, "step_to": 1260, "seconds": 0.6, "total_growth_bytes": 32 * MIB,
            "sites": [site, dict(site, line=99, bytes=1 * MIB, blocks=2)]}


def leak_history(attribution, at=19, ended=30.0):
    """The leak session: its finding pending from t=16, firing from t=18, attributed from `at`."""
    s = {"session": "s-2", "job": ev.JOBS["leak"], "ended": [ended, "clean"] if ended else None,
         "events": [{"kind": "attribution_requested", "detail": "asked for 50 steps or 120 s (request 1)"}]}
    h = []
    for t in range(10, 31):
        findings = []
        if t >= 16:
            f = finding("s-2", "leak", "firing" if t >= 18 else "pending")
            if attribution is not None and t >= at:
                f["attribution"] = attribution
            findings.append(f)
        h.append({"ts": float(t), "sessions": [s], "findings": findings})
    return h, s


def test_the_attributed_line_reads_like_the_daemon_says_it():
    assert a.attribution_line(attributed()) == (
        "train_leak.py:17 in step_output: 30.0 MiB of 32.0 MiB growth (94%), steps 1210-1260 (0.6 s)")
    # 31 MiB in sites against 32 MiB total: the share is of the larger, as detect/attribution.rs has it
    assert a.attribution_share(attributed(), attributed()["sites"][0]) == pytest.approx(30 / 32)
    assert a.attribution_line(attributed(error="unavailable")) == "no sites: unavailable: CUDA is not available to torch 2.5.1"
    empty = dict(attributed(), sites=[])
    assert a.attribution_line(empty).startswith("no site in the trainer's code grew over the window (32.0 MiB growth")


def test_attribution_verdict_needs_the_trainers_line_while_it_runs():
    trainer = {"leak_site": {"file": "train_leak.py", "line": 17, "function": "step_output"}}
    h, s = leak_history(attributed())
    status, figure = a.attribution_verdict(h, s, trainer)
    assert status == "pass", figure
    assert figure == ("train_leak.py:17 in step_output: 30.0 MiB of 32.0 MiB growth (94%), steps 1210-1260 (0.6 s); "
                      "shown 3.0 s after the finding appeared, on the firing finding (expected train_leak.py:17)")
    assert a.attribution_verdict(*leak_history(attributed(line=18)), trainer)[0] == "fail"
    status, figure = a.attribution_verdict(*leak_history(attributed(error="unavailable")), trainer)
    assert status == "fail" and "no sites: unavailable" in figure
    status, figure = a.attribution_verdict(*leak_history(attributed(), at=30, ended=25.0), trainer)
    assert status == "fail" and "AFTER the trainer ended" in figure
    status, figure = a.attribution_verdict(*leak_history(None), trainer)
    assert status == "fail" and figure.endswith("last: attribution_requested: asked for 50 steps or 120 s (request 1)")
    assert a.attribution_verdict(*leak_history(attributed()), {})[0] == "fail"  # no ground truth: no pass
    assert a.attribution_verdict(*leak_history(None), trainer, cpu=True)[0] == "skip"


def test_the_driver_reports_attribution_right_after_the_leak_check():
    import driver

    obs = bundle()
    for snap in obs["history"]:
        for f in snap["findings"]:
            if f["kind"] == "leak" and snap["ts"] >= 22:
                f["attribution"] = attributed()
    obs["trainers"]["leak"]["result"]["leak_site"] = {"file": "train_leak.py", "line": 17}
    obs["leak_attributed"] = {"ts": 20.0, "line": "train_leak.py:17 in step_output"}
    checks = driver.with_attribution(ev.evaluate(obs), obs, cpu=False)
    names = [c.name for c in checks]
    at = names.index("leak detected (step, growth)")
    assert names[at + 1] == driver.ATTRIBUTION_CHECK and len(names) == 23
    check = checks[at + 1]
    assert check.status == report.PASS, check.figure
    assert check.detail == "printed live: train_leak.py:17 in step_output"
    obs["trainers"]["leak"]["result"]["leak_site"]["line"] = 18
    assert driver.with_attribution(ev.evaluate(obs), obs, cpu=False)[at + 1].status == report.FAIL
    assert driver.with_attribution(ev.evaluate(obs), obs, cpu=True)[at + 1].status == report.SKIP
    obs["not_selected"] = ["leak"]
    assert driver.ATTRIBUTION_CHECK not in [c.name for c in driver.with_attribution([], obs, cpu=False)]


def test_oom_cap_found_in_evidence_or_words_and_only_there():
    cap = int(1.5 * GIB)
    assert a.oom_names_cap({"evidence": {"alloc_limit": cap - 4096}}, cap)[0]
    assert a.oom_names_cap({"message": "CUDA out of memory (limit 1.5 GiB)", "evidence": {}}, cap)[0]
    assert a.oom_names_cap({"evidence": {"detail": "Tried to allocate 64.00 MiB (1.50 GiB allowed)"}}, cap)[0]
    ok, why = a.oom_names_cap({"message": "CUDA out of memory: tried to allocate 64.0 MiB with 70.1 GiB free", "evidence": {"alloc_limit": 80 * GIB}}, cap)
    assert not ok and "1.5 GiB" in why


def test_overhead_is_the_mean_of_paired_differences_with_its_interval():
    bare = [0.00040, 0.00041, 0.00042] * 10
    attached = [0.000402, 0.000413, 0.000421] * 10
    o = a.overhead(bare, attached)
    assert o["cost"] == pytest.approx(2e-6) and o["step"] == pytest.approx(0.00041)
    assert o["lo"] <= o["cost"] <= o["hi"] and o["rounds"] == 30
    ok, figure = a.overhead_verdict(o)
    assert ok and "0.49%" in figure and "within the budget" in figure
    # 10 % of the step: over, whatever the noise.
    ok, figure = a.overhead_verdict(a.overhead(bare, [b * 1.1 for b in bare]))
    assert not ok and "over the budget" in figure
    assert not a.overhead_verdict(a.overhead([], []))[0]


def test_rounds_that_hold_a_sample_count_though_most_do_not():
    # A long step: a third of the rounds hold one sample (+30 us a step), the rest none. The
    # median round says the client costs nothing; amortised it costs 10 us a step.
    bare = [0.005] * 30
    attached = [b + (30e-6 if i % 3 == 0 else 0.0) for i, b in enumerate(bare)]
    o = a.overhead(bare, attached)
    assert o["cost"] == pytest.approx(10e-6)
    assert o["lo"] > 0 and o["hi"] < 25e-6


def test_a_noisy_median_within_the_budget_is_not_a_pass():
    # The H100 case: a median near the budget with rounds spread far wider than it.
    bare = [0.00040] * 30
    noise = [(-1) ** i * (i % 7) * 20e-6 for i in range(30)]
    attached = [b + 2e-6 + n for b, n in zip(bare, noise)]
    o = a.overhead(bare, attached)
    ok, figure = a.overhead_verdict(o)
    assert not ok and "unresolved" in figure, figure


def test_the_budget_is_the_documented_one():
    assert a.client_budget(0.0002) == pytest.approx(2e-6)  # 1 % of a 0.2 ms step
    assert a.client_budget(0.002) == pytest.approx(10e-6)  # 0.5 % of a 2 ms step
    assert a.client_budget(0.1) == pytest.approx(25e-6)  # never more than 25 us


def test_poll_verdict():
    assert a.poll_verdict([0.002] * 5, [0.0015] * 5)[0]
    assert not a.poll_verdict([0.010] * 5, [0.002] * 5)[0]
    assert not a.poll_verdict([], [0.001])[0]


def test_trace_summary_counts_phases_and_bye():
    lines = [
        {"type": "hello", "v": 1},
        {"type": "sample", "step": 1},
        {"type": "sample", "step": 2, "phase": "train"},
        {"type": "sample", "step": 2, "phase": "eval"},
        {"type": "event", "kind": "oom"},
        {"type": "sample", "step": 3},
        {"type": "bye"},
    ]
    text = "\n".join(json.dumps(l) for l in lines) + '\n{"type": "sam'
    t = a.trace_summary(a.read_trace(text))
    assert t["hello"] and t["bye"] and t["steps_monotonic"]
    assert (t["train_samples"], t["eval_samples"], t["last_step"], len(t["oom_events"])) == (3, 1, 3, 1)


# --- report --------------------------------------------------------------------------------------


def test_report_table_markdown_and_exit_status():
    checks = [
        report.Check("daemon", report.PASS, "ready in 0.2 s"),
        report.Check("leak | detected", report.FAIL, "no leak finding " * 10, detail="see logs"),
        report.Check("pynvml", report.SKIP, "not installed"),
    ]
    text = report.table(checks, width=80)
    assert "FAIL" in text and "1 passed, 1 failed, 1 skipped" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    md = report.markdown(checks, {"date": "2026-01-01", "gpu": "H100"}, notes=["note"])
    assert "| leak \\| detected | fail |" in md and "- gpu: H100" in md and "- note" in md
    assert report.exit_status(checks) == 1
    assert report.exit_status(checks[:1]) == 0
    assert report.exit_status([]) == 1
    with pytest.raises(ValueError):
        report.Check("x", "passed", "")


# --- evaluate on a synthetic run -------------------------------------------------------------------


def session(sid, job, pid, **extra):
    s = {"session": sid, "job": job, "pid": pid, "samples": 40, "step": 990, "started": 0.0, "ended": [30.0, "clean"], "gpu_uuid": UUID}
    s.update(extra)
    return s


def bundle(**over):
    """A run where everything went right; tests break one thing at a time."""
    J = ev.JOBS
    sessions = [
        session("s-1", J["healthy"], 101),
        session("s-2", J["leak"], 102, step=2000),
        session("s-3", J["near_limit"], 103, alloc_retries_total=57),
        session("s-4", J["oom"], 104),
        session("s-5", J["lightning"], 105),
        session("s-6", J["hf"], 106),
        session("s-7", J["ddp"], 107, rank=0, world_size=2, nvml={"used_memory_bytes": 1}),
        session("s-8", J["ddp"], 108, rank=1, world_size=2, nvml={"used_memory_bytes": 1}),
        dict(session("s-9", J["oom_patterns"], 109), ooms=_patterns_session()["ooms"]),
        dict(session("s-11", J["batch_fit"], 111, step=300), **_batch_fit_view()),
    ]
    history = []
    for t in range(1, 31):
        # The outside trainer: 20 steps a second, 4 MiB taken outside the allocator each step
        # from step 300; NVML's figure is reserved (1 GiB) + the context (500 MiB) + that.
        step = 20 * t
        outside = 500 * MIB + max(0, step - 300) * 4 * MIB
        ledger = {"nvml_used_bytes": GIB + outside, "allocated_bytes": 600 * MIB, "cached_bytes": 424 * MIB,
                  "outside_allocator_bytes": outside, "age_seconds": 0.3}
        live = [dict(x) for x in sessions]
        live.append(session("s-10", J["outside"], 110, step=step, ledger=ledger, ended=None))
        findings = [finding("s-3", "near_limit", "firing" if t >= 3 else "pending")]
        if t >= 25:
            findings.append(finding("s-10", "untracked_growth", "firing", evidence={"slope_bytes_per_step": 4.1 * MIB}))
        if t >= 20:
            findings.append(finding("s-2", "leak", "firing", first_step=900, evidence={"growth_bytes": 400 * MIB}))
        if t >= 10:
            findings.append(finding("s-4", "oom", "firing", evidence={"alloc_bytes": 64 * MIB, "alloc_limit": int(1.5 * GIB)}))
        history.append(
            {
                "ts": float(t),
                "nvml": {"up": True, "driver_version": "550"},
                "gpus": [{"index": 0, "uuid": UUID, "name": "H100", "memory": {"total": 80 * GIB}}],
                "sessions": live,
                "findings": findings,
            }
        )
    ok = {"rc": 0, "timed_out": False, "log_tail": ""}
    obs = {
        "daemon": {"ready_s": 0.3},
        "history": history,
        "trainers": {
            "healthy": dict(ok, result={"steps": 1000, "seconds": 20.0}),
            "leak": dict(ok, result={"onset_step": 700, "onset_ts": 12.0, "leak_bytes_per_step": 2 * MIB, "device_total": 80 * GIB}),
            "near_limit": dict(ok, result={"num_alloc_retries": 60}),
            "oom": dict(ok, result={"cap": int(1.5 * GIB), "chunk_bytes": 64 * MIB, "oom_step": 40}),
            "oom_patterns": dict(ok, result=_patterns_result()),
            "outside": dict(ok, result=_outside_result()),
            "lightning": dict(ok, result={"steps": 120}),
            "hf": dict(ok, result={"steps": 80}),
            "ddp": dict(ok, result={"backend": "gloo"}),
            "batch_fit": dict(ok, result=_batch_fit_result()),
            "batch_fit_truth": dict(ok, result=_batch_fit_truth()),
            "bench": dict(
                ok,
                result={
                    "memory_stats_s": 1.8e-4,
                    "mem_get_info_s": 5e-6,
                    "sizes": {
                        k: {
                            "layers": 3,
                            "runs": {"bare": [st] * 3, "default": [st * 1.004] * 3, "every": [st * 1.3] * 3},
                            "samples": {"default": [3, 3, 3], "every": [750, 750, 750]},
                            "lines_sent": {"default": 12, "every": 2250},
                        }
                        for k, st in (("small", 0.0004), ("large", 0.005))
                    },
                },
            ),
        },
        "traces": {
            "s-5": {"hello": True, "train_samples": 120, "eval_samples": 8, "last_step": 120, "steps_monotonic": True, "bye": True},
            "s-6": {"hello": True, "train_samples": 80, "eval_samples": 4, "last_step": 80, "steps_monotonic": True, "bye": True},
        },
        "comparisons": [{"pid": 101, "status": "match", "diff_mib": 0}],
        "smi": ["nvidia-smi"],
        "metric_polls": [(i, 0.0012) for i in range(20)],
        "bare_polls": [0.001] * 10,
        "smi_times": [0.05] * 5,
        "pynvml_polls": None,
        "daemon_log": "INFO started\n",
        "shutdown": {"rc": 0, "seconds": 0.1, "leftovers": []},
    }
    obs.update(over)
    return obs


def statuses(obs):
    return {c.name: c.status for c in ev.evaluate(obs)}


def test_a_good_run_passes_every_check():
    checks = ev.evaluate(bundle())
    bad = [(c.name, c.status, c.figure) for c in checks if c.status not in (report.PASS, report.INFO, report.SKIP)]
    assert not bad
    assert report.exit_status(checks) == 0
    names = [c.name for c in checks]
    assert names[0] == "daemon starts and sees the GPUs" and len(names) == 22


def test_each_broken_part_fails_its_own_check():
    def broken(mutate, name):
        obs = bundle()
        mutate(obs)
        got = statuses(obs)
        assert got[name] == report.FAIL, got
        assert [n for n, s in got.items() if s == report.FAIL] == [name]

    def healthy_with_finding(o):
        for snap in o["history"]:
            snap["findings"] = snap["findings"] + [finding("s-1", "fragmentation", "pending")]

    def no_leak(o):
        for snap in o["history"]:
            snap["findings"] = [f for f in snap["findings"] if f["kind"] != "leak"]

    def near_limit_flaps(o):
        for snap in o["history"]:
            if snap["ts"] == 15.0:
                snap["findings"] = [finding("s-3", "near_limit", "resolved")]

    def oom_without_cap(o):
        for snap in o["history"]:
            for f in snap["findings"]:
                if f["kind"] == "oom":
                    f["evidence"] = {"alloc_bytes": 64 * MIB}

    def no_eval(o):
        o["traces"]["s-5"] = dict(o["traces"]["s-5"], eval_samples=0)

    def one_rank(o):
        for snap in o["history"]:
            snap["sessions"] = [s for s in snap["sessions"] if s["session"] != "s-8"]

    def samples_every_step(o):
        o["trainers"]["bench"]["result"]["sizes"]["small"]["runs"]["default"] = [0.0005] * 3

    broken(healthy_with_finding, "healthy trainer: sampled, no findings")
    broken(no_leak, "leak detected (step, growth)")
    broken(near_limit_flaps, "near_limit fires and stays firing")
    broken(oom_without_cap, "OOM reported against the allocator cap")
    broken(no_eval, "Lightning callback")
    broken(one_rank, "torchrun, 2 ranks: a session each")
    broken(samples_every_step, "client cost per ~0.4 ms step")

    def hardly_sampled(o):
        o["trainers"]["bench"]["result"]["sizes"]["small"]["samples"]["default"] = [0, 2, 0]

    def nothing_sent(o):
        o["trainers"]["bench"]["result"]["sizes"]["small"]["lines_sent"]["default"] = 0

    broken(hardly_sampled, "client cost per ~0.4 ms step")
    broken(nothing_sent, "client cost per ~0.4 ms step")
    broken(lambda o: o.update(comparisons=[{"pid": 101, "status": "mismatch", "diff_mib": 5}]), "per-process memory = nvidia-smi (MiB)")
    broken(lambda o: o.update(metric_polls=[(i, 0.05) for i in range(9)]), "daemon NVML poll vs bare NVML")
    broken(lambda o: o.update(daemon_log="thread 'poller' panicked at src/sources/poller.rs:1\n"), "daemon log has no panic")
    broken(lambda o: o.update(shutdown={"rc": -9, "seconds": 10.0, "leftovers": ["daemon"]}), "clean shutdown, nothing left running")
    broken(lambda o: o["trainers"]["hf"].update(rc=1, log_tail="Traceback\nImportError: x"), "Hugging Face callback")


def test_skipped_and_failed_daemon():
    obs = bundle()
    obs["trainers"]["lightning"] = {"skipped": "lightning is not installed"}
    assert statuses(obs)["Lightning callback"] == report.SKIP
    only = ev.evaluate({"daemon": {"error": "daemon exited with status 2:\nbad flag"}})
    assert [(c.status, c.figure) for c in only] == [(report.FAIL, "daemon exited with status 2: ... bad flag")]
    only = ev.evaluate({"daemon": {"error": "daemon exited with status 1:\n"}})
    assert only[0].figure == "daemon exited with status 1: (no output)"


def _patterns_result():
    return {"file": "train_oom_patterns.py",
            "lines": {"pressure_failing": 26, "fragmentation_top": 30, "fragmentation_failing": 34, "leak_top": 38},
            "ooms": [{"pattern": "pressure"}, {"pattern": "fragmentation"}, {"pattern": "leak"}]}


def _patterns_session(**change):
    f = "train_oom_patterns.py:%d"
    ooms = [  # newest first, as the daemon lists them
        {"pattern": "leak", "failing_site": None, "top_live_site": f % 38, "survived": True},
        {"pattern": "fragmentation", "failing_site": f % 34, "top_live_site": f % 30, "survived": True},
        {"pattern": "pressure", "failing_site": f % 26, "top_live_site": "train_oom_patterns.py:60", "survived": True},
    ]
    for i, fields in change.items():
        ooms[int(i[1:])].update(fields)
    return {"session": "s-1", "ooms": ooms}


def test_oom_patterns_match_on_pattern_failing_line_and_top_site():
    verdicts = ev.oom_pattern_verdicts(_patterns_session(), _patterns_result())
    assert [(p, ok) for p, ok, _ in verdicts] == [("pressure", True), ("fragmentation", True), ("leak", True)]
    wrong_line = ev.oom_pattern_verdicts(_patterns_session(i1={"failing_site": "train_oom_patterns.py:35"}), _patterns_result())
    assert [ok for _, ok, _ in wrong_line] == [True, False, True] and "expected train_oom_patterns.py:34" in wrong_line[1][2]
    wrong_pattern = ev.oom_pattern_verdicts(_patterns_session(i0={"pattern": "pressure"}), _patterns_result())
    assert not wrong_pattern[2][1] and "no leak OOM" in wrong_pattern[2][2]
    not_survived = ev.oom_pattern_verdicts(_patterns_session(i2={"survived": False}), _patterns_result())
    assert not not_survived[0][1] and "not marked survived" in not_survived[0][2]


def test_armed_recording_cost_is_reported_when_measured():
    obs = bundle()
    obs["trainers"]["bench"]["result"]["sizes"]["small"]["recording"] = [0.0004 * 1.2] * 3
    checks = ev.check_client_cost(obs, "small")
    rec = [c for c in checks if "allocation history" in c.name]
    assert len(rec) == 1 and rec[0].status == report.INFO and "20.0% of the step" in rec[0].figure
    assert not [c for c in ev.check_client_cost(bundle(), "small") if "allocation history" in c.name]


def _outside_result():
    return {"first_raw_step": 300, "chunk_bytes": 4 * MIB, "raw_chunks": 300, "raw_bytes": 1200 * MIB, "step_ms": 50.0, "steps": 600}


def test_outside_growth_must_match_the_raw_bytes_and_add_up():
    name = "memory outside the allocator: ledger and untracked_growth"
    by = lambda obs: {c.name: c for c in ev.evaluate(obs)}[name]  # noqa: E731
    good = by(bundle())
    assert good.status == report.PASS, good.figure
    assert "the trainer took" in good.figure and "30 of 30 views" in good.figure
    # The daemon saw half the growth: a ledger that lost memory fails.
    obs = bundle()
    for snap in obs["history"]:
        for x in snap["sessions"]:
            if x["session"] == "s-10":
                led = dict(x["ledger"])
                led["outside_allocator_bytes"] = 500 * MIB + (led["outside_allocator_bytes"] - 500 * MIB) // 2
                led["nvml_used_bytes"] = GIB + led["outside_allocator_bytes"]
                x["ledger"] = led
    assert by(obs).status == report.FAIL
    # Parts that do not add up to NVML's figure fail.
    obs = bundle()
    obs["history"][5]["sessions"][-1]["ledger"] = dict(obs["history"][5]["sessions"][-1]["ledger"], cached_bytes=1)
    bad = by(obs)
    assert bad.status == report.FAIL and "29 of 30 views" in bad.figure
    # No finding, or a leak besides it, fails.
    obs = bundle()
    for snap in obs["history"]:
        snap["findings"] = [f for f in snap["findings"] if f["kind"] != "untracked_growth"]
    assert "never fired" in by(obs).figure
    obs = bundle()
    obs["history"][-1]["findings"].append(finding("s-10", "leak", "firing"))
    assert by(obs).status == report.FAIL
    # On a CPU it is skipped.
    obs = bundle()
    obs["trainers"]["outside"] = {"skipped": "needs a GPU"}
    assert by(obs).status == report.SKIP


# --- the batch that fits ---------------------------------------------------------------------------
# Recorded-style numbers: train_batch_fit.py's defaults (a 4-layer, 256-wide transformer, AdamW,
# 48 sequences of 256 tokens, fp32) under a 4 GiB cap. Parameters and activations as measured on
# that model; the peak with the temporaries an allocator adds; the truth as a search finds it.

BF_CAP = 4 * GIB
BF_PARAMS = 17102848
BF_ACT = 731676676
BF_PEAK = 912261120


def daemon_largest(split, limit):
    """crates/core/src/core/categories/fit.rs for one batch size, computed apart from it."""
    act, other, batch, peak = split["activations_bytes"], split["other_bytes"], split["batch_size"], split["peak_bytes"]
    per_sample = act / batch * (1 + other / act)
    fixed = peak - per_sample * batch
    return int((limit - limit // 20 - fixed) // per_sample)


def _batch_fit_split(**change):
    named = 4 * BF_PARAMS + BF_ACT
    split = {"step": 3, "parameters_bytes": BF_PARAMS, "gradients_bytes": BF_PARAMS, "optimizer_state_bytes": 2 * BF_PARAMS,
             "buffers_bytes": 0, "activations_bytes": BF_ACT, "batch_size": 48, "fp32_bytes": 2 * BF_PARAMS,
             "ts": 4.2, "peak_bytes": BF_PEAK, "other_bytes": BF_PEAK - named}
    split.update(change)
    return split


def _batch_fit_view(**change):
    split = _batch_fit_split()
    largest = daemon_largest(split, BF_CAP)
    view = {"alloc_limit": BF_CAP, "categories": split, "largest_safe_batch": largest,
            "batch_fit": {"basis": "proportional", "batch_sizes": [48], "bytes_per_sample": 17580203, "fixed_bytes": 68411392,
                          "limit_bytes": BF_CAP, "margin_bytes": BF_CAP // 20, "largest_safe_batch": largest}}
    view.update(change)
    return view


def _batch_fit_result():
    return {"mode": "predict", "batch": 48, "cap": BF_CAP, "steps": 300, "param_bytes": BF_PARAMS,
            "peaks": [905000000] + [BF_PEAK] * 299}


def _batch_fit_truth(largest=241, also=228, also_ok=True):
    ran = {48, 96, 192, 240, 241}
    tries = [{"batch": b, "ok": b in ran} for b in (48, 96, 192, 384, 288, 240, 264, 252, 246, 243, 241, 242)]
    return {"mode": "search", "largest": largest, "smallest_failing": largest + 1, "complete": True, "max_batch": 1 << 16,
            "tries": tries, "also_tried": {"batch": also, "ok": also_ok} if also else None}


def test_the_recorded_numbers_predict_what_the_daemon_would():
    assert daemon_largest(_batch_fit_split(), BF_CAP) == 228


def test_batch_fit_verdict_passes_a_safe_close_prediction():
    fails, f = ev.batch_fit_verdict(228, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK, predicted_ran=True)
    assert fails == []
    assert f["error_batches"] == -13 and abs(f["ratio"] - 228 / 241) < 1e-9 and f["split_error"] == 0.0
    # Exactly the truth, and exactly the lowest ratio allowed, pass too.
    assert ev.batch_fit_verdict(241, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK)[0] == []
    assert ev.batch_fit_verdict(3, 4, split_sum=BF_PEAK, allocator_peak=BF_PEAK)[0] == []


def test_batch_fit_verdict_fails_an_unsafe_over_prediction():
    fails, f = ev.batch_fit_verdict(250, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK)
    assert fails == ["unsafe: predicted 250, but no batch over 241 ran (+9)"] and f["error_batches"] == 9
    # Within the truth, yet the predicted batch ran out of memory when tried on its own.
    fails, _ = ev.batch_fit_verdict(240, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK, predicted_ran=False)
    assert fails == ["unsafe: the predicted batch 240 ran out of memory when tried"]


def test_batch_fit_verdict_fails_an_over_conservative_prediction():
    fails, f = ev.batch_fit_verdict(150, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK)
    assert fails == ["over-conservative: 150 is 62% of the 241 that ran (under 75%)"]
    assert abs(f["ratio"] - 150 / 241) < 1e-9


def test_batch_fit_verdict_fails_a_missing_prediction_with_its_reason():
    fails, f = ev.batch_fit_verdict(None, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK,
                                    no_prediction="no split reached the daemon (the client measures one on step 3)")
    assert fails == ["no prediction: largest_safe_batch is null (no split reached the daemon (the client measures one on step 3))"]
    assert f["error_batches"] is None and f["ratio"] is None
    assert ev.batch_fit_verdict(None, 241, split_sum=None, allocator_peak=None)[0] == [
        "no prediction: largest_safe_batch is null (no reason known)", "the split is unchecked: no split in the session"]


def test_batch_fit_verdict_on_no_fit():
    # The daemon says nothing fits while the trained batch and more ran: fail, saying so.
    fails, f = ev.batch_fit_verdict(0, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK)
    assert fails == ["predicts that no batch fits (0), yet batches up to 241 ran"] and f["ratio"] == 0.0
    # Where not even a batch of 1 runs, 0 is the truth.
    fails, f = ev.batch_fit_verdict(0, 0, split_sum=BF_PEAK, allocator_peak=BF_PEAK)
    assert fails == [] and f["error_batches"] == 0 and f["ratio"] is None
    fails, _ = ev.batch_fit_verdict(3, 0, split_sum=BF_PEAK, allocator_peak=BF_PEAK)
    assert fails == ["unsafe: predicted 3, but no batch over 0 ran (+3)"]


def test_batch_fit_verdict_holds_the_split_to_the_allocator_peak():
    over = int(BF_PEAK * 1.12)
    fails, f = ev.batch_fit_verdict(228, 241, split_sum=over, allocator_peak=BF_PEAK)
    assert len(fails) == 1 and fails[0].startswith("the split (") and "+12.0% off the allocator's peak" in fails[0]
    assert abs(f["split_error"] - 0.12) < 1e-6
    assert ev.batch_fit_verdict(228, 241, split_sum=int(BF_PEAK * 0.91), allocator_peak=BF_PEAK)[0] == []
    assert ev.batch_fit_verdict(228, 241, split_sum=BF_PEAK, allocator_peak=None)[0] == [
        "the split is unchecked: no allocator peak recorded at its step"]


def test_batch_fit_verdict_needs_a_truth():
    fails, _ = ev.batch_fit_verdict(228, 241, split_sum=BF_PEAK, allocator_peak=BF_PEAK, complete=False)
    assert fails == ["the truth is unknown: the search by trying did not finish (largest that ran so far: 241)"]
    fails, f = ev.batch_fit_verdict(228, 65536, split_sum=BF_PEAK, allocator_peak=BF_PEAK, ceiling=65536)
    assert fails == ["the truth is unknown: every batch up to 65536 ran, the cap never bound"] and f["ratio"] is None


def test_why_no_prediction_reads_the_session():
    why = ev.why_no_prediction
    assert why({}) == "no split reached the daemon (the client measures one on step 3)"
    assert why({"categories": _batch_fit_split(partial=["no_grad_forward: nothing saved"])}) == "the split's activations are unknown (no_grad_forward)"
    assert why({"categories": _batch_fit_split(batch_size=None)}) == "the split has no batch size (step 3)"
    assert why({"categories": _batch_fit_split(activations_bytes=0)}) == "the split measured no activations (step 3)"
    assert why({"categories": _batch_fit_split(peak_bytes=None, other_bytes=None)}) == "the split's sample carried no allocator peak"
    assert "no limit" in why({"categories": _batch_fit_split()})


def _batch_fit_check(obs):
    return {c.name: c for c in ev.evaluate(obs)}[ev.BATCH_FIT]


def test_the_batch_fit_check_on_a_recorded_run():
    c = _batch_fit_check(bundle())
    assert c.status == report.PASS, c.figure
    assert c.figure.startswith("predicted 228, by trying 241 (-13 batches, 0.95x); split 870.00 MiB vs allocator peak 870.00 MiB at step 3 (+0.0%)"), c.figure
    assert "trained at batch 48 (measured 48), cap 4.0 GiB" in c.figure
    assert "fit: proportional from batch sizes [48]" in c.detail and "the prediction tried alone: ran" in c.detail
    assert "48 ran, 96 ran, 192 ran, 384 OOM" in c.detail
    facts = ev.batch_fit_facts(bundle())
    assert facts["figures"]["predicted"] == 228 and facts["figures"]["real"] == 241 and facts["fails"] == []


def _with_view(obs, **change):
    for snap in obs["history"]:
        for s in snap["sessions"]:
            if s["session"] == "s-11":
                s.update(change)
    return obs


def test_the_batch_fit_check_fails_each_way_with_its_reason():
    # No prediction in any view: the reason comes from the session's split.
    c = _batch_fit_check(_with_view(bundle(), largest_safe_batch=None, batch_fit=None, categories=None))
    assert c.status == report.FAIL
    assert c.figure.startswith("no prediction: largest_safe_batch is null (no split reached the daemon"), c.figure
    # The prediction over the truth.
    obs = bundle()
    obs["trainers"]["batch_fit_truth"]["result"] = _batch_fit_truth(largest=200, also=228, also_ok=False)
    c = _batch_fit_check(obs)
    assert c.status == report.FAIL and c.figure.startswith(
        "unsafe: predicted 228, but no batch over 200 ran (+28); unsafe: the predicted batch 228 ran out of memory when tried | "), c.figure
    # No fit at all.
    c = _batch_fit_check(_with_view(bundle(), largest_safe_batch=0))
    assert c.status == report.FAIL and c.figure.startswith("predicts that no batch fits (0), yet batches up to 241 ran"), c.figure
    # The search process failed.
    obs = bundle()
    obs["trainers"]["batch_fit_truth"].update(rc=1, log_tail="Traceback\nRuntimeError: CUDA error")
    c = _batch_fit_check(obs)
    assert c.status == report.FAIL and c.figure.startswith("the search by trying: exited with status 1"), c.figure
    # The allocator's peak at the measured step is not the split's.
    obs = bundle()
    obs["trainers"]["batch_fit"]["result"]["peaks"][2] = int(BF_PEAK / 1.2)
    c = _batch_fit_check(obs)
    assert c.status == report.FAIL and "+20.0% off the allocator's peak" in c.figure, c.figure
    # Not selected: skipped.
    obs = bundle(not_selected=["batch_fit"])
    del obs["trainers"]["batch_fit"], obs["trainers"]["batch_fit_truth"]
    assert _batch_fit_check(obs).status == report.SKIP


def test_the_prediction_is_read_from_the_last_view_that_has_one():
    obs = bundle()
    obs["history"][-1]["sessions"] = [dict(s, largest_safe_batch=None) if s["session"] == "s-11" else s for s in obs["history"][-1]["sessions"]]
    _with_view({"history": obs["history"][10:11]}, largest_safe_batch=227)
    view = ev.prediction_view(obs["history"], ev.JOBS["batch_fit"])
    assert view["largest_safe_batch"] == 228 and view is obs["history"][-2]["sessions"][-2]
    assert ev.prediction_view(obs["history"], "no-such-job") is None


def test_the_search_finds_the_largest_batch_that_fits():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import train_batch_fit as t

    def under(limit, seen):
        return lambda b: seen.append(b) or b <= limit

    seen = []
    assert t.largest_fitting(under(241, seen), 48, 1 << 16) == (241, 242, True)
    assert seen == [48, 96, 192, 384, 288, 240, 264, 252, 246, 243, 241, 242]
    assert t.largest_fitting(under(5, []), 48, 1 << 16) == (5, 6, True)  # the start itself does not fit
    assert t.largest_fitting(under(0, []), 48, 1 << 16) == (0, 1, True)
    assert t.largest_fitting(under(10 ** 9, []), 48, 1000) == (1000, None, True)  # the ceiling ran
    calls = []
    assert t.largest_fitting(under(241, calls), 48, 1 << 16, lambda: len(calls) >= 3) == (192, None, False)
