"""python -m gpumon_client run [--job NAME] [--socket PATH] (SCRIPT | -m MODULE) [ARGS...]

Runs an unmodified training script with attach() applied, as `python SCRIPT ARGS` would run it.
"""

import argparse
import os
import runpy
import sys
from typing import List, Optional

USAGE = "python -m gpumon_client run [--job NAME] [--socket PATH] [--every N] (SCRIPT | -m MODULE) [ARGS...]"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpumon_client", usage=USAGE)
    sub = p.add_subparsers(dest="command")
    run = sub.add_parser("run", usage=USAGE, help="run a training script with gpumon attached")
    run.add_argument("--job", help="job label (default: $GPUMON_JOB, else the daemon's choice)")
    run.add_argument("--socket", help="daemon socket (default: $GPUMON_SOCKET, then the standard paths)")
    run.add_argument("--every", type=int, default=1, help="sample every N optimizer steps")
    run.add_argument("-m", dest="module", help="run a module, like python -m")
    run.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or ARGS for -m)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command != "run" or (args.module is None and not args.target):
        _parser().print_usage(sys.stderr)
        return 2

    from . import attach

    attach(job=args.job, socket=args.socket, every=args.every)
    # The script sees the argv and sys.path it would see run directly.
    if args.module is not None:
        sys.argv = [args.module] + args.target
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        script = args.target[0]
        sys.argv = list(args.target)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
