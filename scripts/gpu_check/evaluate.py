"""From observations to checks: one function per check, each reading the bundle the driver
gathered (`obs`, described in driver.py's `Run.observations`) and returning a report.Check.
No I/O here, so every verdict is tested on synthetic bundles."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import analysis as a
from report import FAIL, INFO, PASS, SKIP, Check

JOBS = {
    "healthy": "gpu-check-healthy",
    "leak": "gpu-check-leak",
    "near_limit": "gpu-check-near-limit",
    "oom": "gpu-check-oom",
    "oom_patterns": "gpu-check-oom-patterns",
    "outside": "gpu-check-outside",
    "lightning": "gpu-check-lightning",
    "hf": "gpu-check-hf",
    "ddp": "gpu-check-ddp",
    "batch_fit": "gpu-check-batch-fit",
}



def _trainer_problem(obs: Dict[str, Any], name: str) -> Optional[str]:
    """Why a trainer's run cannot be judged (did not run, failed, timed out), or None."""
    t = obs["trainers"].get(name)
    if t is None:
        return "not run"
    if t.get("timed_out"):
        return "timed out; log: %s" % _tail(t)
    if t.get("rc") != 0:
        return "exited with status %s; log: %s" % (t.get("rc"), _tail(t))
    return None


def _tail(t: Dict[str, Any]) -> str:
    lines = [l for l in (t.get("log_tail") or "").splitlines() if l.strip()]
    return " / ".join(lines[-3:])[-400:] or "(empty)"


def _one_session(obs: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    sessions = a.latest_sessions(obs["history"], JOBS[name])
    return sessions[-1] if sessions else None


def _skipped(obs: Dict[str, Any], name: str, check: str) -> Optional[Check]:
    t = obs["trainers"].get(name)
    if t is not None and t.get("skipped"):
        return Check(check, SKIP, t["skipped"])
    if t is None and name in obs.get("not_selected", ()):
        return Check(check, SKIP, "not selected (--only)")
    return None


def _opening(obs: Dict[str, Any], kind: str, name: str) -> Tuple[Optional[Check], Dict[str, Any], Dict[str, Any]]:
    """What every per-trainer check starts with: (a verdict already reached, or None; the
    trainer's one session; the result file the trainer wrote)."""
    skip = _skipped(obs, kind, name)
    if skip:
        return skip, {}, {}
    problem = _trainer_problem(obs, kind)
    s = _one_session(obs, kind)
    if problem or s is None:
        return Check(name, FAIL, problem or "no session with job %s" % JOBS[kind]), {}, {}
    return None, s, obs["trainers"][kind].get("result") or {}


def check_daemon(obs: Dict[str, Any]) -> Check:
    d = obs["daemon"]
    if d.get("error"):
        lines = [l for l in d["error"].splitlines() if l.strip()]
        figure = lines[0] + (" ... " + lines[-1] if len(lines) > 1 else " (no output)")
        return Check("daemon starts and sees the GPUs", FAIL, figure[:400], " / ".join(lines[1:])[-1500:])
    snap = obs["history"][0] if obs["history"] else {}
    nvml = snap.get("nvml") or {}
    gpus = snap.get("gpus") or []
    g0 = gpus[0] if gpus else {}
    mem = (g0.get("memory") or {}).get("total")
    figure = "ready in %.1f s; NVML %s, driver %s; %d GPU(s); GPU 0 %s, %s" % (
        d.get("ready_s") or 0.0,
        "up" if nvml.get("up") else "DOWN (%s)" % nvml.get("error"),
        nvml.get("driver_version"),
        len(gpus),
        g0.get("name"),
        a.fmt_bytes(mem),
    )
    return Check.verdict("daemon starts and sees the GPUs", bool(nvml.get("up")) and bool(gpus), figure)


def check_healthy(obs: Dict[str, Any]) -> Check:
    name = "healthy trainer: sampled, no findings"
    early, s, result = _opening(obs, "healthy", name)
    if early is not None:
        return early
    steps, seconds = result.get("steps") or 0, result.get("seconds") or 0.0
    kinds = sorted({f["kind"] for snap in obs["history"] for f in a.findings_of_session(snap, s["session"])})
    rate = (s.get("samples") or 0) / seconds if seconds else 0.0
    max_rate = obs.get("max_rate", 10.0)
    ok = (
        (s.get("samples") or 0) > 0
        and not kinds
        and a.ended_clean(s)
        and 0 < (s.get("step") or 0) <= steps
        and rate <= max_rate * 1.2 + 1
    )
    figure = "%d samples over %d steps in %.0f s (%.1f/s), last sampled step %s, findings: %s, %s" % (
        s.get("samples") or 0,
        steps,
        seconds,
        rate,
        s.get("step"),
        ", ".join(kinds) or "none",
        "bye" if a.ended_clean(s) else "no bye (%s)" % (s.get("ended"),),
    )
    return Check.verdict(name, ok, figure)


def check_leak(obs: Dict[str, Any]) -> Check:
    name = "leak detected (step, growth)"
    early, s, result = _opening(obs, "leak", name)
    if early is not None:
        return early
    first = a.first_observed(obs["history"], s["session"], "leak", "firing")
    snap, finding = first if first else (None, None)
    total = result.get("device_total") or s.get("device_total")
    ok, figure = a.leak_verdict(finding, snap.get("ts") if snap else None, result, total)
    others = sorted(
        {f["kind"] for sn in obs["history"] for f in a.findings_of_session(sn, s["session"]) if f["kind"] != "leak"}
    )
    if others:
        figure += "; also raised: %s" % ", ".join(others)
    detail = ""
    if finding is not None:
        ev = finding.get("evidence") or {}
        detail = "slope %s/step (true %s/step), forecast %s steps to OOM; message: %s" % (
            a.fmt_bytes(ev.get("slope_bytes_per_step")),
            a.fmt_bytes(result.get("leak_bytes_per_step")),
            ev.get("oom_eta_steps"),
            finding.get("message"),
        )
    return Check(name, PASS if ok else FAIL, figure, detail)


def check_near_limit(obs: Dict[str, Any]) -> Check:
    name = "near_limit fires and stays firing"
    early, s, result = _opening(obs, "near_limit", name)
    if early is not None:
        return early
    ended_ts = s["ended"][0] if s.get("ended") else None
    ep = a.episodes(a.finding_timeline(obs["history"], s["session"], "near_limit"), ended_ts)
    first = a.first_observed(obs["history"], s["session"], "near_limit", "firing")
    after = "%.1f s" % (first[0]["ts"] - s["started"]) if first else "never"
    figure = "fired after %s; raised %d time(s), resolved %d time(s) while running, firing in %.0f%% of polls after; retries %s (torch %s)" % (
        after,
        ep["raised"],
        ep["resolved_while_live"],
        100 * ep["firing_share"],
        s.get("alloc_retries_total"),
        result.get("num_alloc_retries", "n/a"),
    )
    ok = ep["ever_firing"] and ep["raised"] == 1 and ep["resolved_while_live"] == 0 and ep["firing_share"] >= 0.9
    return Check.verdict(name, ok, figure)


def check_oom(obs: Dict[str, Any]) -> Check:
    name = "OOM reported against the allocator cap"
    early, s, result = _opening(obs, "oom", name)
    if early is not None:
        return early
    cap = result.get("cap")
    finding = None
    for snap in obs["history"]:
        for f in a.findings_of_session(snap, s["session"], "oom"):
            finding = f  # the last view: the evidence as it ended
    if finding is None or cap is None:
        return Check(name, FAIL, "no oom finding (trainer OOM at step %s: %s)" % (result.get("oom_step"), result.get("oom_message")))
    ok, how = a.oom_names_cap(finding, int(cap))
    ev = finding.get("evidence") or {}
    alloc_ok = ev.get("alloc_bytes") == result.get("chunk_bytes")
    figure = "cap %s: %s; tried %s (trainer asked %s); trainer OOM at step %s, finding at step %s; %s" % (
        a.fmt_bytes(cap),
        how,
        a.fmt_bytes(ev.get("alloc_bytes")),
        a.fmt_bytes(result.get("chunk_bytes")),
        result.get("oom_step"),
        ev.get("step", finding.get("first_step")),
        "bye" if a.ended_clean(s) else "no bye",
    )
    return Check(name, PASS if (ok and alloc_ok and a.ended_clean(s)) else FAIL, figure, "message: %s" % finding.get("message"))


def oom_pattern_verdicts(session: Dict[str, Any], result: Dict[str, Any]) -> List[Tuple[str, bool, str]]:
    """Per OOM the trainer caught: (pattern, whether the daemon's record matches it, what it said).
    A record matches when its pattern is the trainer's and its failing line and top live site
    are the lines the trainer marked (where it marked one)."""
    records = session.get("ooms") or []
    lines, file = result.get("lines") or {}, result.get("file") or "?"
    out = []
    for oom in result.get("ooms") or []:
        pat = oom.get("pattern")
        rec = next((r for r in records if r.get("pattern") == pat), None)
        if rec is None:
            seen = ", ".join(str(r.get("pattern")) for r in records) or "none"
            out.append((pat, False, "no %s OOM in the session (its OOMs: %s)" % (pat, seen)))
            continue
        ok, said = True, []
        for key, field in (("failing", "failing_site"), ("top", "top_live_site")):
            want = lines.get("%s_%s" % (pat, key))
            got = rec.get(field)
            said.append("%s %s" % (field, got))
            if want is not None and got != "%s:%d" % (file, want):
                ok = False
                said[-1] += " (expected %s:%d)" % (file, want)
        out.append((pat, ok and bool(rec.get("survived")), "; ".join(said) + ("" if rec.get("survived") else "; not marked survived")))
    return out


def check_oom_patterns(obs: Dict[str, Any]) -> Check:
    name = "real OOMs explained live: pattern, failing line, top live site"
    early, s, result = _opening(obs, "oom_patterns", name)
    if early is not None:
        return early
    verdicts = oom_pattern_verdicts(s, result)
    if not verdicts:
        return Check(name, FAIL, "the trainer caught no OOM")
    figure = " | ".join("%s: %s" % (p, "ok" if ok else "MISMATCH") for p, ok, _ in verdicts)
    detail = " | ".join("%s: %s" % (p, said) for p, _, said in verdicts)
    return Check.verdict(name, all(ok for _, ok, _ in verdicts) and len(verdicts) == 3, figure, detail)


def check_outside(obs: Dict[str, Any]) -> Check:
    name = "memory outside the allocator: ledger and untracked_growth"
    early, s, result = _opening(obs, "outside", name)
    if early is not None:
        return early
    ok, figure = a.outside_verdict(a.ledger_views(obs["history"], s["session"]), result)
    first = a.first_observed(obs["history"], s["session"], "untracked_growth", "firing")
    leaked = a.first_observed(obs["history"], s["session"], "leak", "firing")
    chunk = result.get("chunk_bytes")
    if first is None:
        return Check(name, FAIL, figure + "; untracked_growth never fired")
    snap, finding = first
    slope = (finding.get("evidence") or {}).get("slope_bytes_per_step")
    slope_ok = bool(slope and chunk and abs(slope - chunk) <= 0.25 * chunk)
    figure += "; untracked_growth fired after %.1f s at %s/step (true %s/step)%s" % (
        float(snap.get("ts") or 0.0) - float(s.get("started") or 0.0),
        a.fmt_bytes(slope),
        a.fmt_bytes(chunk),
        "; a leak was raised too" if leaked else "",
    )
    return Check(name, PASS if ok and slope_ok and leaked is None else FAIL, figure, "message: %s" % finding.get("message"))


def _framework(obs: Dict[str, Any], key: str, name: str) -> Check:
    early, s, result = _opening(obs, key, name)
    if early is not None:
        return early
    steps = result.get("steps") or 0
    t = obs["traces"].get(s["session"])
    if t is None:
        return Check(name, FAIL, "no trace file for %s in the record dir" % s["session"])
    ok = (
        t["hello"]
        and 1 <= t["train_samples"] <= steps
        and t["eval_samples"] + t.get("eval_marks", 0) >= 1
        and t["steps_monotonic"]
        and (t["last_step"] or 0) <= steps
        and t["bye"]
        and a.ended_clean(s)
    )
    figure = "%d train samples over %d steps (last step %s), eval: %d samples, %d phase marks, %s" % (
        t["train_samples"],
        steps,
        t["last_step"],
        t["eval_samples"],
        t.get("eval_marks", 0),
        "bye" if t["bye"] else "no bye",
    )
    if not t["steps_monotonic"]:
        figure += ", steps out of order"
    return Check.verdict(name, ok, figure)


def check_lightning(obs: Dict[str, Any]) -> Check:
    return _framework(obs, "lightning", "Lightning callback")


def check_hf(obs: Dict[str, Any]) -> Check:
    return _framework(obs, "hf", "Hugging Face callback")


def check_ddp(obs: Dict[str, Any]) -> Check:
    name = "torchrun, 2 ranks: a session each"
    skip = _skipped(obs, "ddp", name)
    if skip:
        return skip
    problem = _trainer_problem(obs, "ddp")
    sessions = a.latest_sessions(obs["history"], JOBS["ddp"])
    if problem or not sessions:
        return Check(name, FAIL, problem or "no session with job %s" % JOBS["ddp"])
    joined = {
        s["session"]
        for snap in obs["history"]
        for s in a.sessions_of_job(snap, JOBS["ddp"])
        if s.get("nvml")
    }
    ranks = sorted(s.get("rank") for s in sessions if s.get("rank") is not None)
    ok = (
        len(sessions) == 2
        and ranks == [0, 1]
        and all(s.get("world_size") == 2 for s in sessions)
        and all((s.get("samples") or 0) > 0 and a.ended_clean(s) for s in sessions)
        and len({s["pid"] for s in sessions}) == 2
        and joined == {s["session"] for s in sessions}
    )
    backend = (obs["trainers"]["ddp"].get("result") or {}).get("backend")
    figure = "%d sessions, ranks %s, samples %s, %d joined to NVML processes, backend %s" % (
        len(sessions),
        ranks,
        [s.get("samples") for s in sessions],
        len(joined),
        backend,
    )
    return Check.verdict(name, ok, figure)


# --- the batch that fits ---------------------------------------------------------------------------

BATCH_FIT = "batch that fits: predicted vs found by trying"
# Not wastefully small: the prediction keeps 5% of the limit as margin, and the temporaries it
# scales with the batch include workspaces that do not scale, so a good prediction lands at
# 0.85-0.95 of the truth on an activation-bound model; 0.75 leaves room for that and about as
# much again of error, and still fails a prediction that gives away a quarter of the batch.
BATCH_FIT_MIN_RATIO = 0.75
# The split (its categories plus `other`) against the allocator's own peak at the measured step.
SPLIT_MAX_ERROR = 0.10
SPLIT_KEYS = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "buffers_bytes", "activations_bytes")
# `partial` codes with which the daemon cannot scale the activations (crates/core categories.rs).
ACTIVATIONS_UNKNOWN = ("activations_unmeasured", "no_grad_forward")


def split_total(split: Optional[Dict[str, Any]]) -> Optional[int]:
    """Everything the split names plus `other_bytes` (the peak less what is named): what it says
    the step peak was. None without a split."""
    if not split:
        return None
    return sum(int(split.get(k) or 0) for k in SPLIT_KEYS) + int(split.get("other_bytes") or 0)


def prediction_view(history: Sequence[Dict[str, Any]], job: str) -> Optional[Dict[str, Any]]:
    """The last view of the job's latest session that carries a prediction (the session's last
    view when none does; None without a session)."""
    sessions = a.latest_sessions(history, job)
    if not sessions:
        return None
    sid = sessions[-1]["session"]
    found = None
    for snap in history:
        for s in snap.get("sessions") or []:
            if s.get("session") == sid and s.get("largest_safe_batch") is not None:
                found = s
    return found or sessions[-1]


def why_no_prediction(view: Dict[str, Any]) -> str:
    """Why the daemon's largest_safe_batch is null, from the session's own fields."""
    split = view.get("categories")
    if not split:
        return "no split reached the daemon (the client measures one on step 3)"
    codes = [str(p).split(":")[0].strip() for p in split.get("partial") or []]
    unknown = [c for c in codes if c in ACTIVATIONS_UNKNOWN]
    if unknown:
        return "the split's activations are unknown (%s)" % ", ".join(unknown)
    if not split.get("batch_size"):
        return "the split has no batch size (step %s)" % split.get("step")
    if not split.get("activations_bytes"):
        return "the split measured no activations (step %s)" % split.get("step")
    if split.get("peak_bytes") is None:
        return "the split's sample carried no allocator peak"
    return "the daemon knew no limit for the session (no device_free, reserved or alloc_limit)"


def batch_fit_verdict(
    predicted: Optional[int],
    real: Optional[int],
    *,
    split_sum: Optional[int],
    allocator_peak: Optional[int],
    complete: bool = True,
    ceiling: Optional[int] = None,
    predicted_ran: Optional[bool] = None,
    no_prediction: str = "",
    min_ratio: float = BATCH_FIT_MIN_RATIO,
    split_max_error: float = SPLIT_MAX_ERROR,
) -> Tuple[List[str], Dict[str, Any]]:
    """The batch-fit verdict on numbers: (why it fails, empty when it passes; the figures).

    predicted: the daemon's largest_safe_batch (None: null). real: the largest batch that ran
    by trying (None: unknown); complete: whether the search finished; ceiling: set when every
    batch up to it ran (the cap never bound); predicted_ran: whether the predicted batch, tried
    on its own, ran (None: not tried). split_sum: the split with `other`; allocator_peak: the
    allocator's own peak at the measured step."""
    fails: List[str] = []
    figures: Dict[str, Any] = {
        "predicted": predicted,
        "real": real,
        "error_batches": None,
        "ratio": None,
        "split_bytes": split_sum,
        "allocator_peak_bytes": allocator_peak,
        "split_error": None,
        "predicted_ran": predicted_ran,
    }
    known = real is not None and complete and ceiling is None
    if predicted is None:
        fails.append("no prediction: largest_safe_batch is null (%s)" % (no_prediction or "no reason known"))
    if ceiling is not None:
        fails.append("the truth is unknown: every batch up to %d ran, the cap never bound" % ceiling)
    elif real is None or not complete:
        fails.append("the truth is unknown: the search by trying did not finish (largest that ran so far: %s)" % real)
    if predicted is not None and real is not None and known:
        figures["error_batches"] = predicted - real
        figures["ratio"] = predicted / real if real else None
        if predicted > real:
            fails.append("unsafe: predicted %d, but no batch over %d ran (%+d)" % (predicted, real, predicted - real))
        elif predicted == 0 and real > 0:
            fails.append("predicts that no batch fits (0), yet batches up to %d ran" % real)
        elif real and predicted < min_ratio * real:
            fails.append("over-conservative: %d is %.0f%% of the %d that ran (under %.0f%%)" % (predicted, 100 * predicted / real, real, 100 * min_ratio))
    if predicted_ran is False:
        fails.append("unsafe: the predicted batch %s ran out of memory when tried" % predicted)
    if split_sum is None:
        fails.append("the split is unchecked: no split in the session")
    elif not allocator_peak:
        fails.append("the split is unchecked: no allocator peak recorded at its step")
    else:
        err = (split_sum - allocator_peak) / allocator_peak
        figures["split_error"] = err
        if abs(err) > split_max_error:
            fails.append("the split (%s with other) is %+.1f%% off the allocator's peak %s (over %.0f%%)" % (
                a.fmt_bytes(split_sum, 2), 100 * err, a.fmt_bytes(allocator_peak, 2), 100 * split_max_error))
    return fails, figures


def batch_fit_facts(obs: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What the batch-fit check judges, gathered from the bundle: the prediction's session view,
    both trainers' results, the verdict's failures and figures. None when the case did not run."""
    trainers = obs.get("trainers") or {}
    view = prediction_view(obs.get("history") or [], JOBS["batch_fit"])
    result = (trainers.get("batch_fit") or {}).get("result") or {}
    truth = (trainers.get("batch_fit_truth") or {}).get("result") or {}
    if view is None:
        return None
    split = view.get("categories")
    step = (split or {}).get("step")
    peaks = result.get("peaks") or []
    peak = peaks[step - 1] if isinstance(step, int) and 1 <= step <= len(peaks) else None
    also = truth.get("also_tried") or None
    predicted = view.get("largest_safe_batch")
    real = truth.get("largest") if truth else None
    ran = bool(also["ok"]) if also and also.get("batch") == predicted else None
    fails, figures = batch_fit_verdict(
        predicted,
        real,
        split_sum=split_total(split),
        allocator_peak=peak,
        complete=bool(truth.get("complete")),
        ceiling=truth.get("max_batch") if truth and truth.get("smallest_failing") is None and truth.get("complete") else None,
        predicted_ran=ran,
        no_prediction="" if predicted is not None else why_no_prediction(view),
    )
    figures.update(step=step, batch=result.get("batch"), measured_batch=(split or {}).get("batch_size"), cap=result.get("cap"),
                   daemon_peak_bytes=(split or {}).get("peak_bytes"), fit=view.get("batch_fit"),
                   smallest_failing=truth.get("smallest_failing"), tries=len(truth.get("tries") or []))
    return {"fails": fails, "figures": figures, "split": split, "fit": view.get("batch_fit"), "truth": truth}


def check_batch_fit(obs: Dict[str, Any]) -> Check:
    early, s, result = _opening(obs, "batch_fit", BATCH_FIT)
    if early is not None:
        return early
    problem = _trainer_problem(obs, "batch_fit_truth")
    if problem:
        return Check(BATCH_FIT, FAIL, "the search by trying: %s" % problem)
    facts = batch_fit_facts(obs)
    if facts is None:
        return Check(BATCH_FIT, FAIL, "no session with job %s" % JOBS["batch_fit"])
    f, split, fit, truth = facts["figures"], facts["split"] or {}, facts["fit"] or {}, facts["truth"]
    pred, real = f["predicted"], f["real"]
    said = "predicted %s, by trying %s" % (pred, real)
    if f["error_batches"] is not None:
        said += " (%+d batches, %s)" % (f["error_batches"], "%.2fx" % f["ratio"] if f["ratio"] is not None else "n/a")
    if f["split_error"] is not None:
        said += "; split %s vs allocator peak %s at step %s (%+.1f%%)" % (
            a.fmt_bytes(f["split_bytes"], 2), a.fmt_bytes(f["allocator_peak_bytes"], 2), f["step"], 100 * f["split_error"])
    said += "; trained at batch %s (measured %s), cap %s" % (f["batch"], f["measured_batch"], a.fmt_bytes(f["cap"]))
    figure = "; ".join(facts["fails"]) + " | " + said if facts["fails"] else said
    tries = ", ".join("%s %s" % (t.get("batch"), "ran" if t.get("ok") else "OOM") for t in truth.get("tries") or [])
    also = truth.get("also_tried")
    detail = "fit: %s from batch sizes %s, %s/sample, fixed %s, limit %s, margin %s%s; split: %s, other %s, peak in the sample %s; tries: %s%s" % (
        fit.get("basis"), fit.get("batch_sizes"), a.fmt_bytes(fit.get("bytes_per_sample")), a.fmt_bytes(fit.get("fixed_bytes")),
        a.fmt_bytes(fit.get("limit_bytes")), a.fmt_bytes(fit.get("margin_bytes")),
        "" if fit.get("max_error_ratio") is None else ", line error %.1f%%" % (100 * fit["max_error_ratio"]),
        ", ".join("%s %s" % (k[:-6], a.fmt_bytes(split.get(k))) for k in SPLIT_KEYS),
        a.fmt_bytes(split.get("other_bytes")), a.fmt_bytes(split.get("peak_bytes")), tries or "none",
        "; the prediction tried alone: %s" % ("ran" if also.get("ok") else "OOM") if also else "")
    return Check(BATCH_FIT, FAIL if facts["fails"] else PASS, figure, detail)


def check_memory(obs: Dict[str, Any]) -> Check:
    name = "per-process memory = nvidia-smi (MiB)"
    if not obs.get("smi"):
        return Check(name, FAIL, "nvidia-smi not found")
    trainer_pids = {s["pid"] for snap in obs["history"] for s in snap.get("sessions") or []}
    ok, figure = a.memory_verdict(obs["comparisons"], trainer_pids)
    errors = obs.get("smi_errors") or []
    if errors:
        figure += "; %d nvidia-smi errors (first: %s)" % (len(errors), errors[0][:200])
    mismatched = [c for c in obs["comparisons"] if c["status"] in ("mismatch", "missing", "not_in_smi")]
    detail = "; ".join(
        "pid %s: smi %s MiB, daemon %s (%s)" % (c["pid"], c.get("smi_mib"), a.fmt_bytes(c.get("daemon_bytes")), c["status"])
        for c in mismatched[:5]
    )
    return Check(name, PASS if ok else FAIL, figure, detail)


def check_client_cost(obs: Dict[str, Any], size: str) -> List[Check]:
    label = {"small": "~0.4 ms", "large": "~5 ms"}[size]
    name = "client cost per %s step" % label
    skip = _skipped(obs, "bench", name)
    if skip:
        return [skip]
    problem = _trainer_problem(obs, "bench")
    result = (obs["trainers"].get("bench") or {}).get("result") or {}
    entry = (result.get("sizes") or {}).get(size)
    if problem or entry is None:
        return [Check(name, FAIL, problem or "no measurement for the %s step" % size)]
    runs = entry["runs"]
    sent = entry.get("lines_sent") or {}
    samples = entry.get("samples") or {}
    out = []
    default = a.overhead(runs["bare"], runs["default"])
    ok, figure = a.overhead_verdict(default)
    # The client sampled (at least one sample a round, on average) and its lines reached the daemon.
    per_round = samples.get("default") or []
    sampled = all(isinstance(n, int) for n in per_round) and per_round and sum(per_round) >= len(per_round)
    reached = isinstance(sent.get("default"), int) and sent["default"] > 0
    if not (sampled and reached):
        ok, figure = False, figure + "; the client sampled %s per round and sent %s lines" % (samples.get("default"), sent.get("default"))
    figure += "; %d layers, turns of %s steps" % (entry.get("layers", 0), entry.get("steps_per_turn"))
    out.append(Check(name, PASS if ok else FAIL, figure))
    if entry.get("recording"):
        rec = a.overhead(runs["bare"], entry["recording"])
        out.append(Check("  allocation history recording, as armed (%s)" % label, INFO,
                         "%s/step (%.1f%% of the step; pairs spread %s)" % (
                             a.fmt_us(rec["cost"]), 100 * (rec["share"] or 0.0), a.fmt_us(rec["spread"]))))
    every = a.overhead(runs["bare"], runs["every"])
    out.append(
        Check(
            "  sampling every step (%s)" % label,
            INFO,
            "client %s/step (%.1f%% of the step), samples per round %s" % (
                a.fmt_us(every["cost"]),
                100 * (every["share"] or 0.0),
                samples.get("every"),
            ),
        )
    )
    return out


def check_stats_cost(obs: Dict[str, Any]) -> Check:
    skip = _skipped(obs, "bench", "torch.cuda.memory_stats() cost")
    if skip:
        return skip
    result = (obs["trainers"].get("bench") or {}).get("result") or {}
    if "memory_stats_s" not in result:
        return Check("torch.cuda.memory_stats() cost", SKIP, "not measured")
    return Check(
        "torch.cuda.memory_stats() cost",
        INFO,
        "memory_stats() %s, mem_get_info() %s per call" % (a.fmt_us(result["memory_stats_s"]), a.fmt_us(result.get("mem_get_info_s"))),
    )


def check_poll(obs: Dict[str, Any]) -> List[Check]:
    daemon = a.distinct_polls(obs["metric_polls"])
    out = []
    if not obs["bare_polls"]:
        out.append(Check("daemon NVML poll vs bare NVML", FAIL, "bare NVML could not be timed: %s" % (obs.get("bare_error") or "?")))
    else:
        ok, figure = a.poll_verdict(daemon, obs["bare_polls"])
        out.append(Check.verdict("daemon NVML poll vs bare NVML", ok, figure))
    smi = obs.get("smi_times") or []
    out.append(
        Check("  nvidia-smi, one query", INFO, "median %s over %d runs" % (a.fmt_ms(a.median(smi)), len(smi)))
        if smi
        else Check("  nvidia-smi, one query", SKIP, "not timed")
    )
    py = obs.get("pynvml_polls")
    out.append(
        Check("  pynvml, same calls", INFO, "median %s over %d polls" % (a.fmt_ms(a.median(py)), len(py)))
        if py
        else Check("  pynvml, same calls", SKIP, "pynvml is not installed" if py is None else "not timed")
    )
    return out


def check_daemon_log(obs: Dict[str, Any]) -> Check:
    log = obs.get("daemon_log") or ""
    panics = [l for l in log.splitlines() if "panicked" in l]
    errors = [l for l in log.splitlines() if " ERROR " in l or '"level":"ERROR"' in l]
    figure = "%d panics, %d error lines, %d lines" % (len(panics), len(errors), len(log.splitlines()))
    if panics:
        figure += "; first: %s" % panics[0][:200]
    return Check.verdict("daemon log has no panic", not panics, figure)


def check_shutdown(obs: Dict[str, Any]) -> Check:
    sd = obs.get("shutdown") or {}
    ok = sd.get("rc") == 0 and (sd.get("seconds") or 99) < 10 and not sd.get("leftovers")
    figure = "daemon exited %s in %.1f s after SIGTERM; processes left: %s" % (
        sd.get("rc"),
        sd.get("seconds") or 0.0,
        sd.get("leftovers") or "none",
    )
    return Check.verdict("clean shutdown, nothing left running", ok, figure)


def evaluate(obs: Dict[str, Any]) -> List[Check]:
    """Every check, in the order of the report."""
    if obs["daemon"].get("error"):
        return [check_daemon(obs)]
    steps: List[Callable[[Dict[str, Any]], Any]] = [
        check_daemon,
        check_healthy,
        check_memory,
        check_leak,
        check_near_limit,
        check_oom,
        check_oom_patterns,
        check_outside,
        check_lightning,
        check_hf,
        check_ddp,
        check_batch_fit,
        lambda o: check_client_cost(o, "small"),
        lambda o: check_client_cost(o, "large"),
        check_stats_cost,
        check_poll,
        check_daemon_log,
        check_shutdown,
    ]
    out: List[Check] = []
    for step in steps:
        got = step(obs)
        out.extend(got if isinstance(got, list) else [got])
    return out
