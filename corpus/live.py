#!/usr/bin/env python3
"""The corpus both ways: what a daemon fed the corpus traces raised, against `gpumon analyze`.

    python3 corpus/live.py --gpumon target/debug/gpumon [--corpus DIR] [--shape NAME ...]

Sends each trace's trainer lines over the daemon's real socket, one connection per trace, its
times moved to end a second ago, then compares each session's findings as the daemon's API gives
them (kind, first step, severity, state, message) with those `gpumon analyze --format json` gives for the same lines, as
the corpus scorer reads its findings. NVML's figure (`trace_nvml`) is the recorder's line, which
no trainer sends: it is left out both ways, so `untracked_growth` is compared only in that it is
raised on neither side. Exit 0: the same everywhere, but for the exception below; 1: a difference
(listed); 2: could not run.

Sent faster than it ran, a trace reaches the daemon in batches of many lines, where a trainer
sends a line at a time: a rule the daemon applies after each batch (a leak's "no line is named"
clause, added when it would have asked for attribution) can miss a leak raised and resolved
within one batch, which the replay, applying a line at a time, gives the clause. That is the
documented exception (docs/detection.md, "Live and offline: the same story"): a trace whose only
difference is that clause, offline only, on resolved leaks, is listed as it and is no failure.

Not every trace can be sent live. The daemon takes a sample's time from its line only within an
hour behind its arrival (docs/detection.md, "Sample times"), so a trace spanning more than that
is left out (most of the corpus: runs of hours). A script,
not a test: it needs the corpus generated (~20 s) and the daemon fed ~60,000 lines.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List, Optional, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402

# Within the daemon's hour, with room for the time the feeding takes.
MAX_SPAN = 50 * 60.0
# kind, first step, severity, state, message: what a person reads of a finding.
Finding = Tuple[str, Optional[int], Optional[str], Optional[str], Optional[str]]


# A daemon's session id, `s-<start>-<n>`: the replay names a session `s-<n>` when its trace's
# name holds no id (these are the corpus's files, not a recorder's).
SESSION = re.compile(r"\bs-[0-9a-z]+-([0-9]+)\b")


def finding(f: dict) -> Finding:
    message = f.get("message")
    if message is not None:
        message = SESSION.sub(r"s-\1", message)
    return (f["kind"], f.get("first_step"), f.get("severity"), f.get("state"), message)


# The clause a leak gets when the daemon would have asked for attribution but cannot.
NO_LINE = re.compile(r"; no line is named: [^;]*")


def without_no_line(found: Set[Finding]) -> Set[Finding]:
    """`found` with the "no line is named" clause taken out of resolved leaks' messages."""
    out = set()
    for kind, step, severity, state, message in found:
        if kind == "leak" and state == "resolved" and message is not None:
            message = NO_LINE.sub("", message)
        out.add((kind, step, severity, state, message))
    return out


def batch_exception(live: Set[Finding], offline: Set[Finding]) -> bool:
    """The difference is only the documented one: resolved leaks whose message has the clause
    offline and not live (raised and resolved within one of the daemon's read batches)."""
    if without_no_line(live) != without_no_line(offline):
        return False
    return all(f[4] is None or not NO_LINE.search(f[4]) for f in live - offline)


def lines_of(path: str) -> List[dict]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def trainer_lines(lines: List[dict]) -> List[dict]:
    """The lines a trainer sends: NVML's figure (`trace_nvml`) is the recorder's, not its."""
    return [l for l in lines if not str(l.get("type", "")).startswith("trace_")]


def eligible(lines: List[dict]) -> Optional[str]:
    """Why a trace cannot be sent live, or None."""
    ts = [l["ts"] for l in lines if isinstance(l.get("ts"), (int, float))]
    if ts and max(ts) - min(ts) > MAX_SPAN:
        return "spans %.0f min, past the daemon's hour" % ((max(ts) - min(ts)) / 60)
    return None


def start_daemon(gpumon: str, lib: str, work: str) -> Tuple[subprocess.Popen, str, str]:
    config = os.path.join(work, "gpumon.toml")
    with open(config, "w") as f:
        f.write("[ingest]\nmax_lines_per_second = 1000000\n")
    sock = os.path.join(work, "ingest.sock")
    env = dict(os.environ, FAKE_NVML_SCENARIO=os.path.join(HERE, "..", "crates/fake-nvml/scenarios/two_gpus.toml"),
               GPUMON_LOG_LEVEL="info")
    env.pop("GPUMON_LISTEN", None)
    log = open(os.path.join(work, "daemon.log"), "w")
    proc = subprocess.Popen([gpumon, "--config", config, "--log-format", "json", "daemon", "--listen", "127.0.0.1:0",
                             "--nvml-lib", lib, "--socket", sock, "--interval", "1s"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    for line in proc.stderr:
        log.write(line)
        brace = line.find("{")
        fields = json.loads(line[brace:]).get("fields", {}) if brace >= 0 else {}
        if fields.get("message") == "gpumon daemon serving":
            # Drained from now on, or a full pipe would stop the daemon at its next log line.
            threading.Thread(target=lambda: log.writelines(proc.stderr), daemon=True).start()
            return proc, "http://%s" % fields["listen"], sock
        if time.time() > deadline:
            break
    raise SystemExit("gpumon daemon did not start (see %s)" % log.name)


def feed(sock: str, lines: List[dict], shift: float, copy: str) -> str:
    """Sends one trace as its trainer did, and writes what it sent to `copy`; its session id."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    s.settimeout(30)
    r = s.makefile("r")
    out = []
    for l in lines:
        if isinstance(l.get("ts"), (int, float)):
            l = dict(l, ts=round(l["ts"] + shift, 3))
        out.append(json.dumps(l, separators=(",", ":")))
    with open(copy, "w") as f:
        f.write("\n".join(out) + "\n")
    s.sendall((out[0] + "\n").encode())
    welcome = json.loads(r.readline())
    if welcome.get("type") != "welcome":
        raise SystemExit("no welcome: %s" % welcome)
    s.sendall(("\n".join(out[1:]) + "\n").encode())
    s.shutdown(socket.SHUT_WR)
    # Read to the daemon's close: every line is taken.
    while r.readline():
        pass
    s.close()
    return welcome["session"]


def snapshot(url: str) -> dict:
    with urllib.request.urlopen(url + "/api/v1/snapshot", timeout=30) as resp:
        return json.load(resp)


def live_findings(snap: dict) -> Dict[str, Set[Finding]]:
    by: Dict[str, Set[Finding]] = {}
    for f in snap.get("findings", []):
        by.setdefault(f.get("session", ""), set()).add(finding(f))
    return by


def offline_findings(gpumon: str, files: List[str]) -> Dict[str, Set[Finding]]:
    run = subprocess.run([gpumon, "--config", "/dev/null", "analyze", "--format", "json"] + files,
                         capture_output=True)
    if run.returncode not in (0, 1):
        raise SystemExit("analyze exited %d: %s" % (run.returncode, run.stderr.decode(errors="replace")))
    report = json.loads(run.stdout)
    return {os.path.basename(t["file"]): {finding(f) for f in t["findings"]} for t in report["traces"]}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--gpumon", required=True, help="the gpumon binary (e.g. target/debug/gpumon)")
    ap.add_argument("--fake-nvml", help="the fake NVML library (default: libfake_nvml.so beside gpumon)")
    ap.add_argument("--corpus", help="a corpus generate.py wrote (default: generated into a temporary directory)")
    ap.add_argument("--shape", action="append", choices=sorted(generate.SHAPES), help="only these shapes (repeatable)")
    args = ap.parse_args(argv)
    lib = args.fake_nvml or os.path.join(os.path.dirname(os.path.abspath(args.gpumon)), "libfake_nvml.so")
    with tempfile.TemporaryDirectory(prefix="gpumon-corpus-live-") as work:
        corpus = args.corpus
        if corpus is None:
            corpus = os.path.join(work, "corpus")
            cmd = [sys.executable, os.path.join(HERE, "generate.py"), corpus]
            for s in args.shape or []:
                cmd += ["--shape", s]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        files = sorted(os.path.join(corpus, f) for f in os.listdir(corpus) if f.endswith(".jsonl"))
        if args.shape:
            files = [f for f in files if any(os.path.basename(f).startswith(s + "_") for s in args.shape)]
        proc, url, sock = start_daemon(args.gpumon, lib, work)
        try:
            sent: Dict[str, str] = {}
            left_out: List[Tuple[str, str]] = []
            started = time.time()
            os.mkdir(os.path.join(work, "sent"))
            for path in files:
                lines = trainer_lines(lines_of(path))
                why = eligible(lines)
                if why:
                    left_out.append((os.path.basename(path), why))
                    continue
                last = max(l["ts"] for l in lines if isinstance(l.get("ts"), (int, float)))
                copy = os.path.join(work, "sent", os.path.basename(path))
                sent[feed(sock, lines, time.time() - 1.0 - last, copy)] = copy
            fed = time.time() - started
            # The last close is judged at the daemon's next poll.
            time.sleep(2.5)
            live = live_findings(snapshot(url))
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        offline = offline_findings(args.gpumon, sorted(sent.values()))
    diffs, batched = [], []
    for session, path in sorted(sent.items(), key=lambda kv: kv[1]):
        name = os.path.basename(path)
        a, b = live.get(session, set()), offline.get(name, set())
        if a != b:
            line = "%s: live %s, offline %s" % (name, sorted(a, key=str), sorted(b, key=str))
            (batched if batch_exception(a, b) else diffs).append(line)
    kinds: Dict[str, int] = {}
    for found in offline.values():
        for kind, *_ in found:
            kinds[kind] = kinds.get(kind, 0) + 1
    print("%d traces sent live in %.1f s, %d left out; offline found %s" % (
        len(sent), fed, len(left_out), ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items())) or "nothing"))
    for name, why in left_out:
        print("  left out %s: %s" % (name, why))
    if batched:
        print("%d trace(s) differ only by the read-batch exception (a resolved leak's \"no line is "
              "named\" clause, offline only; docs/detection.md):" % len(batched))
        for d in batched:
            print("  " + d)
    if diffs:
        print("%d trace(s) differ (kind, first step, severity, state, message):" % len(diffs))
        for d in diffs:
            print("  " + d)
        return 1
    print("the same findings (kind, first step, severity, state, message) live and offline on every trace sent%s" % (
        ", but for the exception above" if batched else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
