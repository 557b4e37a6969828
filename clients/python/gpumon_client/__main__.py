"""python -m gpumon_client run [--job NAME] [--run-id ID] [--socket PATH] [--every N] [--max-rate R] [--budget F]
    [--write-every S] (SCRIPT | -m MODULE) [ARGS...]
python -m gpumon_client diff BEFORE.pickle AFTER.pickle [--json] [--top N] [--min-bytes B] [--budget MIB]
python -m gpumon_client explain SNAPSHOT.pickle [--json] [--top N] [--limit BYTES] [--budget MIB]
    [--write-trimmed OUT.pickle]

`run` runs an unmodified training script with attach() applied, as `python SCRIPT ARGS` would run
it. `diff` names the lines that allocated the live memory that grew between two
torch.cuda.memory snapshots. `explain` says why a CUDA OOM happened (pressure, fragmentation or
leak), the line that asked and what held the memory. Both are the snapshot tools' (snapshot/cli.py),
imported only when asked for.
"""

import os
import runpy
import sys
from typing import Dict, List, Optional

USAGE = (
    "usage: python -m gpumon_client run [--job NAME] [--run-id ID] [--socket PATH] [--every N] [--max-rate R] [--budget F]"
    " [--write-every S] (SCRIPT | -m MODULE) [ARGS...]\n"
    "       python -m gpumon_client diff BEFORE.pickle AFTER.pickle [--json] [--top N] [--min-bytes B] [--budget MIB]\n"
    "       python -m gpumon_client explain SNAPSHOT.pickle [--json] [--top N] [--limit BYTES] [--budget MIB]\n"
    "           [--write-trimmed OUT.pickle]\n"
    "  --job NAME     the job name gpumon shows and labels the trainer's series with\n"
    "                 (default $GPUMON_JOB, else the daemon names it after the process)\n"
    "  --run-id ID    the run this rank belongs to, the same on every rank: gpumon groups the ranks\n"
    "                 of a run into a job (default $GPUMON_RUN_ID, $TORCHELASTIC_RUN_ID,\n"
    "                 $SLURM_JOB_ID[.$SLURM_STEP_ID], then $MASTER_ADDR:$MASTER_PORT)\n"
    "  --socket PATH  the daemon's ingest socket (default $GPUMON_SOCKET, /run/gpumon/ingest.sock,\n"
    "                 then $XDG_RUNTIME_DIR/gpumon/ingest.sock)\n"
    "  --every N      at least N training steps between samples (default 1)\n"
    "  --max-rate R   at most R samples per second; 0: no limit (default 10)\n"
    "  --budget F     share of step time the client may spend; 0: no limit (default 0.005)\n"
    "  --write-every S  write samples together, at most every S seconds; 0: each at once (default 0.5)\n"
    "diff and explain: python -m gpumon_client diff --help, python -m gpumon_client explain --help\n"
)
COMMANDS = ("run", "diff", "explain")
_CONVERT = {"--job": str, "--run-id": str, "--socket": str, "--every": int, "--max-rate": float, "--budget": float, "--write-every": float}


def _parse(argv: List[str]) -> Optional[Dict[str, object]]:
    # Hand-rolled rather than argparse: everything after SCRIPT (or -m MODULE) belongs to the
    # script, options included, exactly as with the python command.
    if not argv or argv[0] != "run":
        return None
    opts: Dict[str, object] = {
        "job": None,
        "run_id": None,
        "socket": None,
        "every": 1,
        "max_rate": 10.0,
        "budget": 0.005,
        "write_every": 0.5,
        "module": None,
        "target": [],
    }
    rest = argv[1:]
    while rest:
        arg = rest.pop(0)
        if arg in _CONVERT and rest:
            opts[arg[2:].replace("-", "_")] = _CONVERT[arg](rest.pop(0))
        elif arg == "-m" and rest:
            opts["module"] = rest.pop(0)
            opts["target"] = rest
            return opts
        elif arg in _CONVERT or arg == "-m":
            raise ValueError("%s needs a value" % arg)
        elif arg.startswith("-"):
            raise ValueError("unknown option %s" % arg)
        else:
            opts["target"] = [arg] + rest
            return opts
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"], ["help"]) or args[:2] in (["run", "-h"], ["run", "--help"]):
        sys.stdout.write(USAGE)
        return 0
    if args and args[0] not in COMMANDS:
        sys.stderr.write(
            "python -m gpumon_client: unknown command %r (commands: %s)\n%s" % (args[0], ", ".join(COMMANDS), USAGE)
        )
        return 2
    if args and args[0] == "diff":
        from .snapshot import cli

        return cli.diff_main(args[1:])
    if args and args[0] == "explain":
        from .snapshot import cli

        return cli.explain_main(args[1:])
    try:
        opts = _parse(args)
    except ValueError as exc:
        sys.stderr.write("python -m gpumon_client run: %s\n" % exc)
        opts = None
    if opts is None:
        sys.stderr.write(USAGE)
        return 2
    target: List[str] = opts["target"]  # type: ignore[assignment]
    script = None if opts["module"] is not None else target[0]
    if script is not None and not os.path.isfile(script):
        # What `python nope.py` says, instead of a runpy traceback.
        path = os.path.abspath(script)
        reason = "[Errno 21] Is a directory" if os.path.isdir(path) else "[Errno 2] No such file or directory"
        sys.stderr.write("python -m gpumon_client run: can't open file %r: %s\n" % (path, reason))
        return 2

    from . import attach

    try:
        state = attach(
            job=opts["job"],  # type: ignore[arg-type]
            run_id=opts["run_id"],  # type: ignore[arg-type]
            socket=opts["socket"],  # type: ignore[arg-type]
            every=opts["every"],  # type: ignore[arg-type]
            max_rate=opts["max_rate"],  # type: ignore[arg-type]
            budget=opts["budget"],  # type: ignore[arg-type]
            write_every=opts["write_every"],  # type: ignore[arg-type]
        )
    except ValueError as exc:
        sys.stderr.write("python -m gpumon_client run: %s\n%s" % (exc, USAGE))
        return 2
    # When nothing will be reported, attach() said why, once, on stderr.
    # The script sees the argv and sys.path it would see when run directly.
    if opts["module"] is not None:
        sys.argv = [str(opts["module"])] + target
        runpy.run_module(str(opts["module"]), run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(target)
        sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
        runpy.run_path(target[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
