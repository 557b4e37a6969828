"""The judgement half of gpu-check: pure functions over what was observed (snapshots of the
daemon's JSON API, /metrics text, nvidia-smi output, trainer result files, timings). Nothing here
starts a process or opens a socket, so all of it is tested without a GPU (test_gpu_check.py)."""

from __future__ import annotations

import json
import math
import re
import statistics
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

MIB = 1 << 20
GIB = 1 << 30


# --- formatting ----------------------------------------------------------------------------------


def fmt_bytes(b: Optional[float], decimals: int = 1) -> str:
    """Binary units as the daemon prints them (crates/core/src/units.rs): '64.0 MiB', '1.5 GiB'."""
    if b is None:
        return "n/a"
    v = float(abs(b))
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    unit = 0
    while v >= 1024.0 and unit < len(units) - 1:
        v /= 1024.0
        unit += 1
    sign = "-" if b < 0 else ""
    if unit == 0:
        return "%s%d B" % (sign, int(abs(b)))
    return "%s%.*f %s" % (sign, decimals, v, units[unit])


def fmt_us(seconds: Optional[float]) -> str:
    return "n/a" if seconds is None else "%.1f us" % (seconds * 1e6)


def fmt_ms(seconds: Optional[float]) -> str:
    return "n/a" if seconds is None else "%.3f ms" % (seconds * 1e3)


# --- statistics ----------------------------------------------------------------------------------


def median(xs: Iterable[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def percentile(xs: Iterable[float], q: float) -> Optional[float]:
    """Nearest-rank percentile, q in [0, 100]."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    rank = max(1, int(math.ceil(q / 100.0 * len(xs))))
    return xs[min(rank, len(xs)) - 1]


# --- nvidia-smi ----------------------------------------------------------------------------------


def parse_smi_compute_apps(text: str) -> List[Dict[str, Any]]:
    """`nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`.

    Also accepts the two-column form (pid, used_memory). Rows NVML cannot fill ('[N/A]',
    '[Not Supported]') keep used_mib None. A line that is not a row raises ValueError naming it.
    """
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.lower().startswith("no running"):
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) not in (2, 3) or not cols[0].isdigit():
            raise ValueError("nvidia-smi: unexpected line %r" % line)
        uuid = cols[1] if len(cols) == 3 else None
        mem = cols[-1]
        rows.append({"pid": int(cols[0]), "gpu_uuid": uuid, "used_mib": int(mem) if mem.isdigit() else None})
    return rows


# --- /metrics ------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> Dict[str, List[Tuple[Dict[str, str], float]]]:
    """Prometheus text format, enough of it for gpumon's own series: name -> [(labels, value)]."""
    out: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels: Dict[str, str] = {}
        if m.group(2):
            for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2)):
                labels[k] = v
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def metric_value(metrics: Dict[str, List[Tuple[Dict[str, str], float]]], name: str) -> Optional[float]:
    series = metrics.get(name)
    return series[0][1] if series else None


def distinct_polls(observations: Sequence[Tuple[float, float]]) -> List[float]:
    """Poll durations from repeated reads of (gpumon_nvml_polls_total, gpumon_nvml_poll_duration_seconds):
    one per distinct poll count, so a poll read twice counts once."""
    seen = {}
    for count, duration in observations:
        if count is not None and duration is not None:
            seen.setdefault(count, duration)
    return [seen[k] for k in sorted(seen)]


# --- snapshots -----------------------------------------------------------------------------------


def sessions_of_job(snapshot: Dict[str, Any], job: str) -> List[Dict[str, Any]]:
    return [s for s in snapshot.get("sessions") or [] if s.get("job") == job]


def findings_of_session(snapshot: Dict[str, Any], session: str, kind: Optional[str] = None) -> List[Dict[str, Any]]:
    return [
        f
        for f in snapshot.get("findings") or []
        if f.get("session") == session and (kind is None or f.get("kind") == kind)
    ]


def ended_clean(session: Dict[str, Any]) -> bool:
    ended = session.get("ended")
    return bool(ended) and len(ended) == 2 and ended[1] == "clean"


def latest_sessions(history: Sequence[Dict[str, Any]], job: str) -> List[Dict[str, Any]]:
    """The last view of every session of `job` across a history of snapshots, by session id."""
    by_id: Dict[str, Dict[str, Any]] = {}
    for snap in history:
        for s in sessions_of_job(snap, job):
            by_id[s["session"]] = s
    return [by_id[k] for k in sorted(by_id, key=_session_order)]


def _session_order(sid: str) -> Tuple[int, str]:
    # s-17, or s-<daemon start>-17 (ids are unique across daemon restarts).
    m = re.match(r"s-(?:[0-9a-z]+-)?(\d+)$", sid)
    return (int(m.group(1)) if m else 1 << 60, sid)


def finding_timeline(history: Sequence[Dict[str, Any]], session: str, kind: str) -> List[Tuple[float, str, str]]:
    """(snapshot ts, finding id, state) for every observation of `kind` findings of `session`."""
    out = []
    for snap in history:
        for f in findings_of_session(snap, session, kind):
            out.append((float(snap.get("ts") or 0.0), str(f.get("id")), str(f.get("state"))))
    return out


def first_observed(history: Sequence[Dict[str, Any]], session: str, kind: str, state: str = "firing") -> Optional[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(snapshot, finding) at the first snapshot where a `kind` finding of `session` is in `state`."""
    for snap in history:
        for f in findings_of_session(snap, session, kind):
            if f.get("state") == state:
                return snap, f
    return None


def episodes(timeline: Sequence[Tuple[float, str, str]], live_until: Optional[float]) -> Dict[str, Any]:
    """How a finding behaved while its session was live: distinct raises (ids; a re-raise gets
    `#n`), resolutions seen before the session ended, and the share of observations after the
    first firing one that were firing."""
    ids = []
    resolved_live = set()
    firing_seen = False
    after, firing_after = 0, 0
    for ts, fid, state in timeline:
        if fid not in ids:
            ids.append(fid)
        if live_until is not None and ts > live_until:
            continue
        if state == "resolved":
            resolved_live.add(fid)
        if state == "firing":
            firing_seen = True
        if firing_seen:
            after += 1
            firing_after += state == "firing"
    return {
        "raised": len(ids),
        "resolved_while_live": len(resolved_live),
        "firing_share": (firing_after / after) if after else 0.0,
        "ever_firing": firing_seen,
    }


# --- leak attribution ----------------------------------------------------------------------------


def first_attributed(history: Sequence[Dict[str, Any]], session: str) -> Optional[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(snapshot, leak finding) at the first snapshot where a leak finding of `session` carries
    the trainer's attribution (its sites, or why it could not)."""
    for snap in history:
        for f in findings_of_session(snap, session, "leak"):
            if f.get("attribution"):
                return snap, f
    return None


def _basename(path: Any) -> str:
    return str(path or "?").rstrip("/").rsplit("/", 1)[-1]


def attribution_share(a: Dict[str, Any], site: Dict[str, Any]) -> float:
    """A site's share of the window's growth, as the daemon computes it (detect/attribution.rs):
    of the larger of the total and the sites' sum."""
    total = max(int(a.get("total_growth_bytes") or 0), sum(int(s.get("bytes") or 0) for s in a.get("sites") or []))
    return (int(site.get("bytes") or 0) / total) if total else 0.0


def attribution_line(a: Dict[str, Any]) -> str:
    """One line for the terminal: 'train_leak.py:41 in step_output: 12.5 MiB of 12.5 MiB growth
    (100%), steps 1210-1260 (0.6 s)', or the trainer's reason when it could not attribute."""
    if a.get("error"):
        return "no sites: %s: %s" % (a.get("error"), a.get("detail") or "")
    window = "steps %s-%s" % (a.get("step_from"), a.get("step_to"))
    if a.get("seconds") is not None:
        window += " (%.1f s)" % float(a["seconds"])
    sites = a.get("sites") or []
    if not sites:
        return "no site in the trainer's code grew over the window (%s growth, %s)" % (fmt_bytes(a.get("total_growth_bytes")), window)
    top = sites[0]
    return "%s:%s in %s: %s of %s growth (%.0f%%), %s" % (
        _basename(top.get("file")),
        top.get("line"),
        top.get("function"),
        fmt_bytes(top.get("bytes")),
        fmt_bytes(a.get("total_growth_bytes")),
        100.0 * attribution_share(a, top),
        window,
    )


def attribution_verdict(
    history: Sequence[Dict[str, Any]], session: Dict[str, Any], trainer: Dict[str, Any], cpu: bool = False
) -> Tuple[str, str]:
    """(status, figure) for 'the leak's line is named live': the first attribution on the leak
    trainer's leak finding names the line the trainer leaks from (its result file's
    `leak_site`), and arrived while the trainer was still running. On the CPU self-test there is
    no allocation history to record: skip."""
    if cpu:
        return "skip", "the CPU self-test has no CUDA allocation history to record"
    expected = trainer.get("leak_site") or {}
    want = "%s:%s" % (expected.get("file"), expected.get("line"))
    found = first_attributed(history, session["session"])
    if found is None:
        said = [
            "%s: %s" % (e.get("kind"), e.get("detail"))
            for snap in history
            for s in sessions_of_job(snap, session.get("job") or "")
            if s.get("session") == session["session"]
            for e in s.get("events") or []
            if str(e.get("kind", "")).startswith("attribution")
        ]
        why = said[-1] if said else "the daemon never asked (no attribution_requested event)"
        return "fail", "no attribution on the leak finding (expected %s); last: %s" % (want, why)
    snap, finding = found
    a = finding["attribution"]
    line = attribution_line(a)
    ended = (session.get("ended") or [None])[0]
    live = ended is None or float(snap.get("ts") or 0.0) <= float(ended)
    raised_ts = None
    for sn in history:
        if findings_of_session(sn, session["session"], "leak"):
            raised_ts = float(sn.get("ts") or 0.0)
            break
    after = " %.1f s after the finding appeared," % (float(snap.get("ts") or 0.0) - raised_ts) if raised_ts is not None else ""
    figure = "%s; shown%s on the %s finding%s (expected %s)" % (
        line,
        after,
        finding.get("state"),
        "" if live else " AFTER the trainer ended",
        want,
    )
    top = (a.get("sites") or [{}])[0]
    ok = (
        not a.get("error")
        and live
        and bool(expected)
        and _basename(top.get("file")) == expected.get("file")
        and top.get("line") == expected.get("line")
    )
    return ("pass" if ok else "fail"), figure


# --- trace files ---------------------------------------------------------------------------------


def read_trace(text: str) -> List[Dict[str, Any]]:
    """A trace file (one JSON object per line, hello first); a torn last line is ignored."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def trace_summary(lines: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    samples = [m for m in lines if m.get("type") == "sample"]
    train = [m for m in samples if m.get("phase", "train") == "train"]
    evals = [m for m in samples if m.get("phase") == "eval"]
    steps = [m.get("step") for m in train if isinstance(m.get("step"), int)]
    return {
        "hello": bool(lines) and lines[0].get("type") == "hello",
        "train_samples": len(train),
        "eval_samples": len(evals),
        # Trainer callbacks mark evaluation with phase events (samples come from training steps).
        "eval_marks": sum(1 for m in lines if m.get("type") == "event" and m.get("kind") == "phase" and m.get("phase") == "eval"),
        "last_step": max(steps) if steps else None,
        "steps_monotonic": all(a <= b for a, b in zip(steps, steps[1:])),
        "bye": any(m.get("type") == "bye" for m in lines),
        "oom_events": [m for m in lines if m.get("type") == "event" and m.get("kind") == "oom"],
    }


# --- the checks' verdicts ------------------------------------------------------------------------


def compare_process_memory(
    before: Dict[str, Any], smi_rows: Sequence[Dict[str, Any]], after: Dict[str, Any], gpu_uuid: str
) -> List[Dict[str, Any]]:
    """Per-process memory on one GPU: the daemon's (from the snapshot before and after one
    nvidia-smi call) against nvidia-smi's MiB. A process whose daemon value changed between the
    two snapshots was allocating at the time and is marked unstable (not comparable)."""

    def daemon_view(snap: Dict[str, Any]) -> Dict[int, Optional[int]]:
        # nvidia-smi's compute-apps query lists compute contexts only; graphics-only processes
        # (Xorg) are the daemon's alone.
        return {
            int(p["pid"]): p.get("used_memory_bytes")
            for p in snap.get("processes") or []
            if (p.get("uuid") == gpu_uuid or p.get("mig_uuid") == gpu_uuid) and p.get("kind", "compute") != "graphics"
        }

    b, a = daemon_view(before), daemon_view(after)
    out = []
    for row in smi_rows:
        if row.get("gpu_uuid") not in (None, gpu_uuid):
            continue
        pid = row["pid"]
        entry: Dict[str, Any] = {"pid": pid, "smi_mib": row.get("used_mib"), "daemon_bytes": a.get(pid)}
        if pid not in b and pid not in a:
            entry["status"] = "missing"  # nvidia-smi lists it, the daemon did neither time
        elif pid not in b or pid not in a or b[pid] != a[pid] or a[pid] is None or row.get("used_mib") is None:
            entry["status"] = "unstable"
        else:
            diff = abs(a[pid] // MIB - row["used_mib"])
            entry["diff_mib"] = diff
            entry["status"] = "match" if diff <= 1 else "mismatch"
        out.append(entry)
    smi_pids = {r["pid"] for r in smi_rows if r.get("gpu_uuid") in (None, gpu_uuid)}
    for pid in sorted(set(b) & set(a) - smi_pids):
        out.append({"pid": pid, "smi_mib": None, "daemon_bytes": a[pid], "status": "not_in_smi"})
    return out


def memory_verdict(comparisons: Sequence[Dict[str, Any]], trainer_pids: Iterable[int]) -> Tuple[bool, str]:
    """Passes when every comparable reading matched to the MiB, at least one instrumented
    trainer's was among them, and no process was listed by one side only (both sides read once
    NVML list each time, so a pid on one side only means pid namespaces differ)."""
    trainer_pids = set(trainer_pids)
    matched = [c for c in comparisons if c["status"] == "match"]
    mismatched = [c for c in comparisons if c["status"] == "mismatch"]
    one_sided = [c for c in comparisons if c["status"] in ("missing", "not_in_smi")]
    trainers = {c["pid"] for c in matched} & trainer_pids
    worst = max([c.get("diff_mib", 0) for c in matched + mismatched] or [0])
    figure = "%d/%d readings match (max diff %d MiB), %d trainer pids compared, %d one-sided" % (
        len(matched),
        len(matched) + len(mismatched),
        worst,
        len(trainers),
        len(one_sided),
    )
    ok = bool(matched) and not mismatched and bool(trainers) and not one_sided
    return ok, figure


def leak_verdict(
    finding: Optional[Dict[str, Any]],
    first_snapshot_ts: Optional[float],
    trainer: Dict[str, Any],
    device_total: Optional[int],
) -> Tuple[bool, str]:
    """The leak finding against the trainer's ground truth (`trainer`: its result file: onset
    step and time, bytes leaked per step). Passes when it was raised at or after the onset and
    fired before the floor grew max(2 GiB, 3% of the device) past it (docs/detection.md)."""
    if finding is None:
        return False, "no leak finding fired (%s steps run, %s leaked)" % (
            trainer.get("steps"),
            fmt_bytes(trainer.get("leaked_bytes")),
        )
    onset = trainer.get("onset_step")
    per_step = trainer.get("leak_bytes_per_step") or 0
    first = finding.get("first_step")
    ev = finding.get("evidence") or {}
    true_growth = None
    if first is not None and onset is not None:
        true_growth = max(0, first - onset) * per_step
    allowed = max(2 * GIB, 0.03 * device_total) if device_total else 2 * GIB
    secs = None
    if first_snapshot_ts is not None and trainer.get("onset_ts") is not None:
        secs = first_snapshot_ts - trainer["onset_ts"]
    figure = "first step %s (onset %s, +%s steps); growth %s by the finding, %s true; firing %s after onset" % (
        first,
        onset,
        (first - onset) if (first is not None and onset is not None) else "?",
        fmt_bytes(ev.get("growth_bytes")),
        fmt_bytes(true_growth),
        "%.1f s" % secs if secs is not None else "?",
    )
    ok = first is not None and onset is not None and first >= onset and true_growth is not None and true_growth <= allowed
    if first is not None and onset is not None and first < onset:
        figure += " (raised BEFORE the leak began)"
    elif true_growth is not None and true_growth > allowed:
        figure += " (over the allowed %s)" % fmt_bytes(allowed)
    return ok, figure


def cap_texts(cap: int) -> List[str]:
    """Ways a message can spell the allocator cap: the daemon's '1.5 GiB', torch's '1.50 GiB'."""
    out = []
    for decimals in (1, 2):
        out.append(fmt_bytes(cap, decimals))
    return out


def oom_names_cap(finding: Dict[str, Any], cap: int) -> Tuple[bool, str]:
    """Whether an oom finding carries the allocator cap: `alloc_limit` in its evidence within
    2 MiB of `cap` (set_per_process_memory_fraction rounds), or the cap spelled in its message or
    detail."""
    ev = finding.get("evidence") or {}
    limit = ev.get("alloc_limit", finding.get("alloc_limit"))
    if isinstance(limit, (int, float)) and abs(limit - cap) <= 2 * MIB:
        return True, "evidence.alloc_limit = %s" % fmt_bytes(limit, 2)
    for field in ("message", "detail"):
        text = finding.get(field) if field == "message" else ev.get(field)
        if not text:
            continue
        for spelled in cap_texts(cap):
            if spelled in text:
                return True, "%s says %s" % (field, spelled)
    return False, "cap %s not in evidence.alloc_limit (%r), message or detail" % (fmt_bytes(cap), limit)


def client_budget(step: float) -> float:
    """The client's whole cost allowed per step (docs/performance.md): 1 % of a step under 1 ms,
    0.5 % of a longer one, never more than 25 us."""
    return min((0.01 if step < 1e-3 else 0.005) * step, 25e-6)


def overhead(bare: Sequence[float], attached: Sequence[float], resamples: int = 2000) -> Dict[str, Optional[float]]:
    """Client cost per step from paired rounds (seconds per step each): the mean of the per-round
    differences (a round's modes take turns, which cancels drift), and a 95 % bootstrap interval of
    that mean (fixed seed: the same rounds give the same interval). The mean, not the median: the
    cost is amortised, and where a round holds few samples the median round is one with the usual
    count of them and misses the rest."""
    import random

    pairs = list(zip(bare, attached))
    diffs = [a - b for b, a in pairs]
    step = median(bare)
    cost = statistics.fmean(diffs) if diffs else None
    lo = hi = None
    if diffs:
        rng = random.Random(0)
        means = sorted(statistics.fmean(rng.choice(diffs) for _ in diffs) for _ in range(resamples))
        lo, hi = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return {
        "step": step,
        "cost": cost,
        "lo": lo,
        "hi": hi,
        "rounds": len(diffs),
        "share": (cost / step) if (cost is not None and step) else None,
        "spread": (max(diffs) - min(diffs)) if diffs else None,
    }


def overhead_verdict(o: Dict[str, Optional[float]]) -> Tuple[bool, str]:
    """Within the budget only when the whole interval is: an interval that straddles the budget
    is not a pass (more rounds, or a quieter machine, resolve it)."""
    if o["step"] is None or o["cost"] is None or o["lo"] is None or o["hi"] is None:
        return False, "not measured"
    budget = client_budget(o["step"])
    if o["hi"] <= budget:
        verdict = "within the budget"
    elif o["lo"] > budget:
        verdict = "over the budget"
    else:
        verdict = "unresolved: the interval straddles the budget"
    figure = "step %s, client %s/step (%.2f%%), 95%% interval %s..%s over %d rounds, budget %s: %s" % (
        fmt_ms(o["step"]),
        fmt_us(o["cost"]),
        100.0 * (o["share"] or 0.0),
        fmt_us(o["lo"]),
        fmt_us(o["hi"]),
        o["rounds"] or 0,
        fmt_us(budget),
        verdict,
    )
    return o["hi"] <= budget, figure


def poll_verdict(daemon: Sequence[float], bare: Sequence[float]) -> Tuple[bool, str]:
    """The daemon's NVML poll against the same NVML calls made bare: the daemon may spend at most
    twice the bare time plus 1 ms (it also reads /proc for new processes and builds its model)."""
    d50, d95, b50 = median(daemon), percentile(daemon, 95), median(bare)
    if d50 is None or b50 is None:
        return False, "not measured (daemon polls %d, bare polls %d)" % (len(daemon), len(bare))
    figure = "daemon p50 %s p95 %s over %d polls; bare NVML p50 %s over %d" % (
        fmt_ms(d50),
        fmt_ms(d95),
        len(daemon),
        fmt_ms(b50),
        len(bare),
    )
    return d50 <= 2 * b50 + 0.001, figure


# --- the memory ledger ---------------------------------------------------------------------------


def ledger_views(history: Sequence[Dict[str, Any]], session: str) -> List[Tuple[int, Dict[str, Any]]]:
    """(the session's step, its ledger) at every snapshot where the ledger knew what lay outside
    the allocator."""
    out = []
    for snap in history:
        for s in snap.get("sessions") or []:
            led = s.get("ledger") or {}
            if s.get("session") == session and led.get("outside_allocator_bytes") is not None and s.get("step") is not None:
                out.append((int(s["step"]), led))
    return out


def outside_verdict(views: Sequence[Tuple[int, Dict[str, Any]]], result: Dict[str, Any]) -> Tuple[bool, str]:
    """Whether the ledger added up to NVML's figure in every view, and its growth outside the
    allocator between the first and last view inside the trainer's growth matches the raw bytes
    the trainer took in those steps: within 10% and two seconds of growth (a sample and a poll
    are up to a poll apart)."""
    if not views:
        return False, "no ledger with a known outside part"
    bad = [
        (step, led)
        for step, led in views
        if (led.get("allocated_bytes") or 0) + (led.get("cached_bytes") or 0) + led["outside_allocator_bytes"] != led.get("nvml_used_bytes")
    ]
    first = result.get("first_raw_step")
    chunk, chunks = result.get("chunk_bytes"), result.get("raw_chunks") or 0
    if first is None or not chunk:
        return False, "the trainer took no memory outside the allocator"
    growing = [(s, led) for s, led in views if first + 20 <= s <= first + chunks]
    if len(growing) < 2:
        return False, "fewer than 2 ledger views while the trainer grew (%d views in all)" % len(views)
    (s0, l0), (s1, l1) = growing[0], growing[-1]
    got = l1["outside_allocator_bytes"] - l0["outside_allocator_bytes"]
    want = (s1 - s0) * chunk
    per_second = chunk * 1000.0 / float(result.get("step_ms") or 50.0)
    slack = 0.1 * want + 2 * per_second
    ok = not bad and abs(got - want) <= slack
    figure = "outside grew %s over steps %d-%d (the trainer took %s); the parts added up to NVML's figure in %d of %d views" % (
        fmt_bytes(got), s0, s1, fmt_bytes(want), len(views) - len(bad), len(views))
    return ok, figure
