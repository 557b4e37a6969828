"""Tests of the leak-detection corpus: determinism, protocol conformance, label exactness, evaluate.py,
and the detectors' scores at both sampling cadences (fixed and the client's adaptive one).

Run with `python3 -m pytest -q corpus`. Generating both cadences takes ~20 s; it is done once per
session (plus once more for the determinism check). The scoring tests run `gpumon analyze` from
$GPUMON_BIN or target/debug/gpumon (build it first: `cargo build`); without it they skip, or fail
when GPUMON_REQUIRE_TOOLS=1 (scripts/check sets it).
"""

import copy
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import evaluate  # noqa: E402
import floor_model as fm  # noqa: E402
import generate  # noqa: E402
import score  # noqa: E402
import summary  # noqa: E402
from cadence import CADENCES, adaptive_keep  # noqa: E402
from sim import Rng, Sim  # noqa: E402

ROOT = os.path.dirname(HERE)
PEAK = "allocated_bytes.all.peak"

STATS_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "requested_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
)
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
KINDS = {"leak", "near_limit", "fragmentation", "oom", "crash", "untracked_growth", "cache_growth"}


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory: Any) -> str:
    out = str(tmp_path_factory.mktemp("corpus"))
    assert generate.main([out, "--cadence", "both"]) == 0
    return out


@pytest.fixture(scope="session")
def corpus(corpus_root: str) -> str:
    return os.path.join(corpus_root, "fixed")


@pytest.fixture(scope="session", params=CADENCES)
def cadence(request: Any) -> str:
    return request.param


@pytest.fixture(scope="session")
def trace_dir(corpus_root: str, cadence: str) -> str:
    return os.path.join(corpus_root, cadence)


def read_labels(trace_dir: str) -> List[Dict[str, Any]]:
    with open(os.path.join(trace_dir, "labels.json"), encoding="utf-8") as f:
        return json.load(f)["traces"]


@pytest.fixture(scope="session")
def labels(trace_dir: str) -> List[Dict[str, Any]]:
    return read_labels(trace_dir)


def read_trace(path: str) -> List[Dict[str, Any]]:
    with open(path, "rb") as f:
        raw = f.read()
    for n, line in enumerate(raw.split(b"\n")[:-1], 1):
        assert len(line) + 1 <= 65536, "%s:%d longer than the protocol's 64 KiB" % (path, n)
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode("utf-8").splitlines()]


@pytest.fixture(scope="session")
def parsed(trace_dir: str, labels: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    return {lab["file"]: read_trace(os.path.join(trace_dir, lab["file"])) for lab in labels}


def train_samples(msgs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [m for m in msgs if m["type"] == "sample" and m["phase"] == "train"]


def alloc(m: Dict[str, Any]) -> int:
    return m["stats"]["allocated_bytes.all.current"]


# --- generator ------------------------------------------------------------------------------
def same_files(a_dir: str, b_dir: str, names: List[str]) -> None:
    for name in names:
        with open(os.path.join(a_dir, name), "rb") as a, open(os.path.join(b_dir, name), "rb") as b:
            assert a.read() == b.read(), name


def test_generator_is_deterministic(corpus: str, tmp_path: Any) -> None:
    # The fixed cadence only: the adaptive traces are a function of these (and the subset test
    # below regenerates some of them).
    again = str(tmp_path / "again")
    assert generate.main([again]) == 0
    names = sorted(os.listdir(corpus))
    assert names == sorted(os.listdir(again))
    same_files(corpus, again, names)


def test_a_subset_holds_the_same_traces(corpus_root: str, tmp_path: Any) -> None:
    sub = str(tmp_path / "sub")
    assert generate.main([sub, "--shape", "leak_oom_crash", "--cadence", "both"]) == 0
    for cadence in CADENCES:
        names = [n for n in os.listdir(os.path.join(sub, cadence)) if n != "labels.json"]
        assert len(names) == len(generate.INSTANCES)
        same_files(os.path.join(corpus_root, cadence), os.path.join(sub, cadence), names)


def test_corpus_covers_every_shape_on_both_devices(trace_dir: str, cadence: str, labels: List[Dict[str, Any]]) -> None:
    for shape in generate.SHAPES:
        mine = [lab for lab in labels if lab["shape"] == shape]
        assert len(mine) >= 3, shape
        assert {lab["device_total"] for lab in mine} == {42505273344, 85520809984}, shape
        assert all(lab["cadence"] == cadence for lab in mine)
    size = sum(os.path.getsize(os.path.join(trace_dir, n)) for n in os.listdir(trace_dir))
    assert size < 125e6
    # A cache creeping 138 MiB a step fills a device in a few hundred steps: those runs are short.
    lengths = [lab["last_step"] for lab in labels if lab["shape"] != "cache_creep"]
    assert min(lengths) >= 1000 and max(lengths) >= 40000
    assert min(lab["last_step"] for lab in labels) >= 300


# --- protocol ---------------------------------------------------------------------------------
def test_every_trace_parses_as_the_protocol(parsed: Dict[str, List[Dict[str, Any]]], labels: List[Dict[str, Any]], cadence: str) -> None:
    by_file = {lab["file"]: lab for lab in labels}
    for name, msgs in parsed.items():
        lab = by_file[name]
        hello = msgs[0]
        assert hello["type"] == "hello" and hello["v"] == 1, name
        assert isinstance(hello["pid"], int) and isinstance(hello["gpu_uuid"], str)
        assert hello["gpu_uuid"].startswith("GPU-")
        assert all(m["type"] != "hello" for m in msgs[1:]), name
        assert all(m["type"] in ("sample", "event", "bye", "trace_nvml") for m in msgs[1:]), name
        # The recorder's notes of NVML's figure carry their poll's time, which may precede the
        # trainer's previous line (an eval ran through the poll): in order among themselves.
        notes = [m for m in msgs if m["type"] == "trace_nvml"]
        assert notes, name
        assert all(isinstance(m["used_bytes"], int) and m["used_bytes"] > 0 for m in notes), name
        assert all(a["ts"] < b["ts"] for a, b in zip(notes, notes[1:])), name
        msgs = [m for m in msgs if m["type"] != "trace_nvml"]
        byes = [i for i, m in enumerate(msgs) if m["type"] == "bye"]
        if lab["ended"] == "crash":
            assert byes == [], name
        else:
            assert byes == [len(msgs) - 1], name
        last_ts = 0.0
        last_train = last_step = 0
        for m in msgs[1:]:
            assert isinstance(m["ts"], float) and m["ts"] >= last_ts, name
            last_ts = m["ts"]
            if m["type"] == "sample":
                assert isinstance(m["step"], int) and m["phase"] in ("train", "eval")
                assert set(m["stats"]) == set(STATS_KEYS), name
                assert all(isinstance(v, int) and v >= 0 for v in m["stats"].values()), name
                assert m["device_total"] == lab["device_total"]
                assert isinstance(m["device_free"], int) and 0 <= m["device_free"] < m["device_total"]
                if m["phase"] == "train":
                    assert m["step"] > last_step, name
                    last_train = m["step"]
                elif cadence == "fixed":
                    assert m["step"] == last_train, "eval samples carry the last train step"
                else:
                    # The train sample of the step before the eval may not have been sent.
                    assert m["step"] >= last_train, name
                last_step = m["step"]
            elif m["type"] == "event":
                assert m["kind"] in ("oom", "phase", "mark", "snapshot"), name
                if m["kind"] == "oom":
                    assert isinstance(m["alloc_bytes"], int) and isinstance(m["device_free"], int)
                    assert m["detail"].startswith("CUDA out of memory. Tried to allocate ")
                elif m["kind"] == "phase":
                    assert m["phase"] in ("train", "eval")
                elif m["kind"] == "mark":
                    assert isinstance(m["detail"], str)
                else:
                    assert isinstance(m["path"], str)


def test_allocator_numbers_are_consistent(parsed: Dict[str, List[Dict[str, Any]]], cadence: str) -> None:
    for name, msgs in parsed.items():
        samples = [m for m in msgs if m["type"] == "sample"]
        others = set()
        prev = {k: 0 for k in COUNTERS}
        for m in samples:
            st = m["stats"]
            a, p, r = st["allocated_bytes.all.current"], st["allocated_bytes.all.peak"], st["reserved_bytes.all.current"]
            assert a % 512 == 0 and p % 512 == 0 and r % (2 << 20) == 0, name
            assert a <= p, (name, m["step"])
            if cadence == "fixed":
                assert p <= r, (name, m["step"])
            else:
                # A peak carried over a skipped sample may predate a cache flush: over reserved,
                # never over what the allocator could hold.
                assert p <= r + m["device_free"], (name, m["step"])
            assert st["active_bytes.all.current"] >= a
            assert st["requested_bytes.all.current"] <= a
            assert st["inactive_split_bytes.all.current"] <= r - a
            for k in COUNTERS:
                assert st[k] >= prev[k], (name, k)
                prev[k] = st[k]
            # device_free = total - reserved - memory outside the allocator, constant but in the
            # shapes that make it move.
            others.add(m["device_total"] - m["device_free"] - r)
        assert len(others) == 1 or name.startswith("outside_"), name


def test_healthy_training_is_flat_after_warmup(parsed: Dict[str, List[Dict[str, Any]]], labels: List[Dict[str, Any]]) -> None:
    for lab in labels:
        if lab["kind"] != "healthy":
            continue
        start = max(lab["warmup_end_step"], lab["level_shift_step"] or 0)
        floors = [alloc(m) for m in train_samples(parsed[lab["file"]]) if m["step"] > start]
        half = len(floors) // 2
        grown = min(floors[half:]) - min(floors[:half])
        if lab["drift_model"]:
            assert 0 < grown < 0.1 * lab["growth_budget_bytes"], lab["file"]
        else:
            # Small retained tensors of varying size (up to 2 MiB), or variable-length batches.
            assert abs(grown) <= (64 << 20 if lab["varlen"] else 2 << 20), (lab["file"], grown)


# --- labels ---------------------------------------------------------------------------------
def test_label_fields(labels: List[Dict[str, Any]]) -> None:
    for lab in labels:
        assert set(lab["expect"]) <= KINDS and set(lab["forbid"]) <= KINDS
        assert not set(lab["expect"]) & set(lab["forbid"]), lab["file"]
        assert lab["step_seconds"] > 0
        if lab["kind"] == "leak":
            assert "leak" in lab["expect"]
            if lab["shape"] != "leak_oom_crash":
                assert "near_limit" in lab["forbid"], "leaks end well clear of the limit"
            model = lab["floor_model"]
            assert lab["floor_at_onset_bytes"] == fm.floor_bytes(model, lab["leak_onset_step"])
            assert lab["oom_step"] is not None and lab["oom_step"] > lab["leak_onset_step"]
        else:
            assert "leak" in lab["forbid"] and lab["oom_step"] is None
    shapes = {lab["shape"]: lab for lab in labels}
    assert "near_limit" in shapes["near_limit"]["expect"]
    assert set(shapes["leak_oom_crash"]["expect"]) == {"leak", "near_limit", "oom", "crash"}


def test_leak_floors_follow_the_label_model(parsed: Dict[str, List[Dict[str, Any]]], labels: List[Dict[str, Any]], cadence: str) -> None:
    for lab in labels:
        if lab["kind"] != "leak":
            continue
        model = lab["floor_model"]
        excess = [alloc(m) - fm.floor_bytes(model, m["step"]) for m in train_samples(parsed[lab["file"]]) if m["step"] >= lab["leak_onset_step"]]
        assert min(excess) >= 0, lab["file"]
        if lab["accum_period"]:
            k = lab["accum_period"]
            at_step = [alloc(m) - fm.floor_bytes(model, m["step"]) for m in train_samples(parsed[lab["file"]]) if m["step"] >= lab["leak_onset_step"] and m["step"] % k == 0]
            # The adaptive cadence may never land on an optimizer step (it samples every 8 micro-batches).
            assert at_step or cadence == "adaptive", lab["file"]
            assert max(at_step, default=0) == 0, "after the optimizer step the floor is the model"
        elif not lab["varlen"]:
            assert sorted(excess)[len(excess) // 2] <= 2 << 20, lab["file"]
        # The label's model really did grow the floor past the detection budget during the run.
        assert fm.growth_at(model, lab["last_step"]) > lab["growth_budget_bytes"], lab["file"]


def test_oom_step_is_where_the_peak_meets_the_limit(labels: List[Dict[str, Any]]) -> None:
    for lab in labels:
        if lab["kind"] != "leak":
            continue
        model, extra, limit = lab["floor_model"], lab["peak_extra_max_bytes"], lab["oom_limit_bytes"]
        crossing = fm.first_crossing(model, extra, limit)
        if lab["ended"] == "crash":
            # Real OOM: the first batch whose own peak did not fit, never before the model's max peak could.
            assert lab["oom_step"] == lab["first_oom_step"] and lab["oom_step"] >= crossing
            assert lab["oom_step"] - crossing < 0.25 * (lab["oom_step"] - lab["leak_onset_step"])
        else:
            s = lab["oom_step"]
            assert s == crossing and s > lab["last_step"]
            assert fm.floor_bytes(model, s) + extra >= limit > fm.floor_bytes(model, s - 1) + extra


def test_oom_crash_traces_retry_then_oom_then_die(parsed: Dict[str, List[Dict[str, Any]]], labels: List[Dict[str, Any]]) -> None:
    for lab in labels:
        if lab["shape"] != "leak_oom_crash":
            continue
        msgs = parsed[lab["file"]]
        first_oom = next(i for i, m in enumerate(msgs) if m["type"] == "event" and m["kind"] == "oom")
        before = [m for m in msgs[:first_oom] if m["type"] == "sample"]
        after = [m for m in msgs[first_oom:] if m["type"] == "sample"]
        assert before[-1]["step"] < lab["oom_step"]
        assert before[0]["stats"]["num_alloc_retries"] == 0 < before[-1]["stats"]["num_alloc_retries"]
        assert after and all(m["stats"]["num_ooms"] >= 1 for m in after), "num_ooms is seen rising"
        assert msgs[-1]["type"] == "event" and msgs[-1]["kind"] == "oom", "dies at its last OOM, no bye"
        assert any(m["type"] == "event" and m["kind"] == "snapshot" for m in msgs)


def test_near_limit_runs_retry_on_a_flat_floor(parsed: Dict[str, List[Dict[str, Any]]], labels: List[Dict[str, Any]]) -> None:
    for lab in labels:
        if lab["shape"] not in ("near_limit", "oom_recovered"):
            continue
        train = train_samples(parsed[lab["file"]])
        assert train[-1]["stats"]["num_alloc_retries"] >= 3
        assert min(m["device_free"] for m in train) < 0.05 * lab["device_total"]
        if lab["shape"] == "oom_recovered":
            assert train[-1]["stats"]["num_ooms"] >= 1 and lab["ended"] == "bye"


# --- the adaptive cadence ---------------------------------------------------------------------
def test_adaptive_traces_are_the_fixed_runs_thinned(corpus_root: str) -> None:
    """Same run, same lines, minus the train samples the client's rule skips; peaks carried over.
    (One trace per shape: cadence.thin itself is unit-tested in test_cadence.py.)"""
    thinned = 0
    for shape in generate.SHAPES:
        name = "%s_a100_s1.jsonl" % shape
        fixed = read_trace(os.path.join(corpus_root, "fixed", name))
        adaptive = read_trace(os.path.join(corpus_root, "adaptive", name))
        train = [m for m in fixed if m["type"] == "sample" and m["phase"] == "train"]
        keep = adaptive_keep([(m["step"], m["ts"]) for m in train])
        assert sum(keep) > 0, name
        thinned += sum(keep) < len(train)
        kept_steps = {m["step"] for m, k in zip(train, keep) if k}
        expected = []
        highest = 0
        for m in fixed:
            if m["type"] == "sample":
                highest = max(highest, m["stats"][PEAK])
                if m["phase"] == "train" and m["step"] not in kept_steps:
                    continue
                m = copy.deepcopy(m)
                m["stats"][PEAK] = highest
                highest = 0
            expected.append(m)
        assert adaptive == expected, name
    assert thinned >= 10, "most shapes sample more often than every 8 steps"


def test_labels_read_what_the_simulation_did() -> None:
    """Labels come from the lines (so a thinned trace is labelled by what it shows); on the fixed
    cadence that is exactly what the simulation counted."""
    for shape in ("leak_oom_crash", "oom_recovered"):
        name = "%s_a100_s1.jsonl" % shape
        kind, fill, _ = generate.SHAPES[shape]
        rng = Rng(generate.seed_of(name))
        cfg = generate.common(rng, "a100", shape, kind)
        fill(rng, cfg)
        sim = Sim(cfg, rng)
        sim.run()
        seen = generate.observe(sim.lines)
        assert seen == {"retries": sim.retries_seen, "min_free": sim.min_free, "train": sim.samples, "eval": sim.eval_samples}
        assert sim.retries_seen > 0 and sim.first_retry is not None
        first_seen = next(m for m in map(json.loads, sim.lines) if m["type"] == "sample" and m["stats"]["num_alloc_retries"] > 0)
        assert sim.first_retry[0] <= first_seen["step"] and sim.first_retry[1] <= first_seen["ts"]


def test_labels_agree_across_cadences(corpus_root: str) -> None:
    fixed, adaptive = (read_labels(os.path.join(corpus_root, c)) for c in CADENCES)
    assert [lab["file"] for lab in fixed] == [lab["file"] for lab in adaptive]
    derived = {"cadence", "train_samples", "retries_seen", "expect", "forbid"}
    for f, a in zip(fixed, adaptive):
        assert {k: v for k, v in f.items() if k not in derived} == {k: v for k, v in a.items() if k not in derived}
        assert (f["cadence"], a["cadence"]) == ("fixed", "adaptive")
        # 1 s-scale steps: one sample per 8 steps, or per `sample_every` if it is coarser, in
        # whole multiples of it; the first two samples are 16 steps apart.
        period = f["sample_every"] * -(-8 // f["sample_every"])
        assert f["last_step"] // period - 2 <= a["train_samples"] <= f["last_step"] // period + 1, a["file"]
        # Thinning can hide allocator retries (then near_limit is no longer expected), never add them.
        assert set(f["expect"]) ^ set(a["expect"]) <= {"near_limit"}, a["file"]
        assert a["retries_seen"] <= f["retries_seen"]
        assert set(f.get("truth", {})) >= set(a.get("truth", {}))


# --- the detectors on the corpus --------------------------------------------------------------
def gpumon_binary() -> str:
    path = os.environ.get("GPUMON_BIN") or os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "debug", "gpumon")
    if not os.access(path, os.X_OK):
        why = "no gpumon binary at %s (cargo build, or set GPUMON_BIN)" % path
        if os.environ.get("GPUMON_REQUIRE_TOOLS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


def test_detectors_meet_the_criteria(trace_dir: str, cadence: str, labels: List[Dict[str, Any]]) -> None:
    """evaluate.py's criteria at both cadences: a detector that only works with a sample on every
    step fails here. leak_accelerating's forecast is a known limit (docs/detection.md)."""
    found = evaluate.index_findings(score.analyze(gpumon_binary(), trace_dir), "analyze")
    lines, failed = evaluate.evaluate(labels, found, ("leak_accelerating",))
    scores = summary.table(summary.per_kind(labels, found))
    print("\n".join(["", "%s cadence" % cadence] + scores))
    failing = [x for x in lines if "| FAIL: " in x]
    assert failed == 0, "\n".join(["%s cadence: %d traces fail" % (cadence, failed)] + lines[:2] + failing + [""] + scores)


# --- evaluate.py ------------------------------------------------------------------------------
def perfect(labels: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What an ideal detector would print: the expected kinds, leaks at a quarter of the budget."""
    traces = []
    for lab in labels:
        findings = []
        for kind in lab["expect"]:
            f: Dict[str, Any] = {"kind": kind, "confidence": 0.99, "message": "synthetic"}
            if kind == "leak":
                model = lab["floor_model"]
                step = fm.first_crossing(model, 0, lab["floor_at_onset_bytes"] + lab["growth_budget_bytes"] // 4)
                f.update(first_step=step, oom_eta_steps=lab["oom_step"] - step)
            if kind == "cache_growth":
                step = lab["cache_growth"]["onset_step"] + 50
                f.update(first_step=step, oom_eta_steps=lab["cache_full_step"] - step)
            findings.append(f)
        traces.append({"file": "some/dir/" + lab["file"], "job": "j", "rank": 0, "samples": 1, "findings": findings})
    return {"traces": traces}


def failures(labels: List[Dict[str, Any]], doc: Dict[str, Any]) -> Dict[str, List[str]]:
    found = evaluate.index_findings(doc, "test")
    return {lab["file"]: evaluate.judge(lab, found.get(lab["file"]))[0] for lab in labels}


def leak_finding(doc: Dict[str, Any], name: str) -> Dict[str, Any]:
    trace = next(t for t in doc["traces"] if t["file"].endswith("/" + name))
    return next(f for f in trace["findings"] if f["kind"] == "leak")


def test_evaluate_passes_a_perfect_analysis(corpus: str, labels: List[Dict[str, Any]], tmp_path: Any) -> None:
    path = tmp_path / "perfect.json"
    path.write_text(json.dumps(perfect(labels)))
    run = subprocess.run(
        [sys.executable, os.path.join(HERE, "evaluate.py"), os.path.join(corpus, "labels.json"), str(path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("| pass |") == len(labels)


@pytest.mark.parametrize(
    "breakage, shape, message",
    [
        ("healthy_leak", "warmup_then_flat", "false leak"),
        ("miss", "leak_tiny_long", "missed leak"),
        ("late", "leak_staircase", "late: floor grew"),
        ("early", "leak_late_onset", "before it began"),
        ("forecast", "leak_linear", "off by 50%"),
        ("no_forecast", "leak_noisy", "no oom_eta_steps"),
        ("no_near_limit", "near_limit", "missed near_limit"),
        ("absent", "leak_eval_only", "not in the analyze output"),
    ],
)
def test_evaluate_fails_wrong_analyses(labels: List[Dict[str, Any]], breakage: str, shape: str, message: str) -> None:
    doc = perfect(labels)
    lab = next(x for x in labels if x["shape"] == shape)
    name = lab["file"]
    trace = next(t for t in doc["traces"] if t["file"].endswith("/" + name))
    if breakage == "healthy_leak":
        trace["findings"].append({"kind": "leak", "first_step": 500, "oom_eta_steps": 1000})
    elif breakage == "miss":
        trace["findings"] = []
    elif breakage == "late":
        f = leak_finding(doc, name)
        f["first_step"] = fm.first_crossing(lab["floor_model"], 0, lab["floor_at_onset_bytes"] + lab["growth_budget_bytes"] + 1)
        f["oom_eta_steps"] = lab["oom_step"] - f["first_step"]
    elif breakage == "early":
        leak_finding(doc, name)["first_step"] = lab["leak_onset_step"] // 2
    elif breakage == "forecast":
        f = leak_finding(doc, name)
        f["oom_eta_steps"] = round(1.5 * (lab["oom_step"] - f["first_step"]))
    elif breakage == "no_forecast":
        leak_finding(doc, name)["oom_eta_steps"] = None
    elif breakage == "no_near_limit":
        trace["findings"] = [f for f in trace["findings"] if f["kind"] != "near_limit"]
    elif breakage == "absent":
        doc["traces"].remove(trace)
    result = failures(labels, doc)
    assert any(message in r for r in result[name]), result[name]
    assert [n for n, r in result.items() if r] == [name], "only the broken trace fails"


def test_forecast_tolerance_boundary(labels: List[Dict[str, Any]]) -> None:
    lab = next(x for x in labels if x["shape"] == "leak_oom_crash")
    step = lab["leak_onset_step"] + 100
    left = lab["oom_step"] - step
    assert evaluate.forecast_error(step, left * 1.35, lab["oom_step"]) == pytest.approx(0.35)
    doc = perfect([lab])
    f = leak_finding(doc, lab["file"])
    f["first_step"] = step
    f["oom_eta_steps"] = int(left * 0.66)  # 34% early: passes
    assert failures([lab], doc)[lab["file"]] == []
    f["oom_eta_steps"] = int(left * 0.64)  # 36% early: fails
    assert failures([lab], doc)[lab["file"]]


def test_evaluate_cli_exit_codes(corpus: str, labels: List[Dict[str, Any]], tmp_path: Any) -> None:
    script = os.path.join(HERE, "evaluate.py")
    labels_path = os.path.join(corpus, "labels.json")
    doc = perfect(labels)
    doc["traces"][0]["findings"].append({"kind": "leak", "first_step": 10})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, script, labels_path, str(bad)], capture_output=True, text=True)
    assert run.returncode == 1 and "FAIL: false leak" in run.stdout
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    run = subprocess.run([sys.executable, script, labels_path, str(garbage)], capture_output=True, text=True)
    assert run.returncode == 2 and "garbage.json is not JSON" in run.stderr
    run = subprocess.run([sys.executable, script, labels_path, "-"], input='{"traces": 3}', capture_output=True, text=True)
    assert run.returncode == 2 and '"traces" list' in run.stderr


def test_evaluate_rejects_inconsistent_labels(labels: List[Dict[str, Any]]) -> None:
    broken = copy.deepcopy([x for x in labels if x["kind"] == "leak"][:1])
    broken[0]["floor_at_onset_bytes"] += 512
    with pytest.raises(evaluate.InputError, match="disagrees"):
        evaluate.check_labels({"traces": broken}, "labels.json")
