"""The snapshot tools' commands, as `python -m gpumon_client diff | explain` runs them.

    python -m gpumon_client diff BEFORE.pickle AFTER.pickle [--json] [--top N] [--min-bytes B] [--budget MIB]
    python -m gpumon_client explain SNAPSHOT.pickle [--json] [--top N] [--limit BYTES] [--request BYTES]
        [--device N] [--budget MIB] [--write-trimmed OUT.pickle [--window N]]

Arguments are parsed here, files read by load.py, the analyses are diff.py's, explain.py's and
trim.py's, the text render.py's. Bad input is one line on stderr naming the file or value, with
exit status 2.
"""

import argparse
import json
import sys
from typing import Any, Callable, Iterable, Optional

from . import trim
from .diff import diff
from .explain import explain
from .load import DEFAULT_BUDGET, SnapshotError, load, validate
from .render import diff_text, explanation_text, trimmed_text

__all__ = ["diff_main", "explain_main", "parse_bytes", "DIFF_PROG", "EXPLAIN_PROG"]

DIFF_PROG = "python -m gpumon_client diff"
EXPLAIN_PROG = "python -m gpumon_client explain"

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9}


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
        if n < minimum:
            raise argparse.ArgumentTypeError("%d is less than %d" % (n, minimum))
        return n

    return parse


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not 0 <= value < 2 ** 50 or value != value:
        raise argparse.ArgumentTypeError("%r is not a byte count (e.g. 4294967296, 4GiB, 512MiB)" % text)
    return int(value * _UNITS[unit])


def add_budget(p: argparse.ArgumentParser) -> None:
    """--budget MIB: what reading a snapshot may keep in memory (load.DEFAULT_BUDGET)."""
    p.add_argument("--budget", type=count(1), default=DEFAULT_BUDGET >> 20, metavar="MIB",
                   help="keep at most MIB of a snapshot in memory while reading it; the file itself may be "
                        "any size (default %(default)s)")
    # The former cap on the file's size: now the same budget, on what is kept.
    p.add_argument("--max-size", type=count(1), dest="budget", help=argparse.SUPPRESS)


def _parse(p: argparse.ArgumentParser, argv: Optional[Iterable[str]]) -> Any:
    """The parsed arguments, or the exit status argparse chose (usage errors 2, --help 0)."""
    try:
        return p.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def diff_main(argv: Optional[Iterable[str]] = None) -> int:
    """Exit status: 0 nothing grew, 1 growth found (by site, or without stacks), 2 bad input."""
    p = argparse.ArgumentParser(
        prog=DIFF_PROG,
        description="Where the live CUDA memory that grew between two torch.cuda.memory snapshots was allocated.",
        epilog="Exit status: 0 nothing grew, 1 growth was found, 2 a file could not be used.",
    )
    p.add_argument("before", metavar="BEFORE.pickle")
    p.add_argument("after", metavar="AFTER.pickle")
    p.add_argument("--json", action="store_true", help="print JSON: {\"sites\": [...], \"total_growth_bytes\": N}")
    p.add_argument("--top", type=count(1), default=10, metavar="N", help="at most N sites (default 10)")
    p.add_argument("--min-bytes", type=count(0), default=1 << 20, metavar="B",
                   help="leave out sites that grew by less (default 1 MiB)")
    add_budget(p)
    args = _parse(p, argv)
    if isinstance(args, int):
        return args
    try:
        before = load(args.before, budget=args.budget << 20, keep="diff")
        after = load(args.after, budget=args.budget << 20, keep="diff")
    except SnapshotError as exc:
        sys.stderr.write("%s: %s\n" % (DIFF_PROG, exc))
        return 2
    report = diff(before, after, top=args.top, min_bytes=args.min_bytes)
    if args.json:
        out = report.as_json()
        if report.no_stack_bytes:
            out["no_stack_bytes"] = report.no_stack_bytes
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        sys.stdout.write(diff_text(report, args.before, args.after, min_bytes=args.min_bytes))
    return 1 if report.grew() else 0


def explain_main(argv: Optional[Iterable[str]] = None) -> int:
    """Exit status: 0 explained (whatever the pattern), 2 a file that could not be read or was refused."""
    p = argparse.ArgumentParser(
        prog=EXPLAIN_PROG,
        description="Why a CUDA OOM happened (pressure, fragmentation or leak), the line that asked and what held "
                    "the memory, from a torch.cuda.memory snapshot taken at the OOM.",
        epilog="Exit status: 0 explained (any pattern, 'none' when the snapshot holds no OOM), 2 the file could "
               "not be read or was refused.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT.pickle")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--top", type=count(1), default=10, metavar="N", help="at most N live sites (default 10)")
    p.add_argument("--limit", type=parse_bytes, metavar="BYTES",
                   help="the allocator's cap, e.g. 4GiB (a snapshot does not hold it; torch's error says 'allowed')")
    p.add_argument("--request", type=parse_bytes, metavar="BYTES",
                   help="the failed request, for a snapshot whose history has no OOM entry")
    p.add_argument("--device", type=count(0), metavar="N", help="the CUDA device (default: the latest OOM's)")
    add_budget(p)
    p.add_argument("--write-trimmed", metavar="OUT.pickle",
                   help="also write the snapshot trimmed to what this explanation needs (the device's segments, "
                        "the history around the OOM, the allocations of what was alive at it), for "
                        "https://pytorch.org/memory_viz; its size is printed")
    p.add_argument("--window", type=count(0), default=None, metavar="N",
                   help="history entries kept before the OOM in the trimmed file (default 2000)")
    args = _parse(p, argv)
    if isinstance(args, int):
        return args
    try:
        # The trimmed file is read by memory_viz, which wants every field: keep them all then.
        snap = load(args.snapshot, budget=args.budget << 20, check=False,
                    keep="all" if args.write_trimmed else "explain")
    except SnapshotError as exc:
        sys.stderr.write("%s: %s\n" % (EXPLAIN_PROG, exc))
        return 2
    ex = explain(snap, request_bytes=args.request, limit_bytes=args.limit, device=args.device, top=args.top)
    if args.json:
        sys.stdout.write(json.dumps(ex.as_json(), indent=1) + "\n")
    else:
        sys.stdout.write(explanation_text(ex, args.snapshot))
    if args.write_trimmed:
        try:
            validate(snap, args.snapshot)
            info = trim.write(args.write_trimmed, snap, device=args.device,
                              window=trim.DEFAULT_WINDOW if args.window is None else args.window)
        except (SnapshotError, OSError) as exc:
            sys.stderr.write("%s: cannot write the trimmed snapshot: %s\n" % (EXPLAIN_PROG, exc))
            return 2
        # On stderr under --json, so that stdout stays one JSON document.
        (sys.stderr if args.json else sys.stdout).write(trimmed_text(args.write_trimmed, info) + "\n")
    return 0
