"""python -m gpumon_client run [--job NAME] [--socket PATH] [--every N] (SCRIPT | -m MODULE) [ARGS...]

Runs an unmodified training script with attach() applied, as `python SCRIPT ARGS` would run it.
"""

import os
import runpy
import sys
from typing import Dict, List, Optional

USAGE = "usage: python -m gpumon_client run [--job NAME] [--socket PATH] [--every N] (SCRIPT | -m MODULE) [ARGS...]\n"


def _parse(argv: List[str]) -> Optional[Dict[str, object]]:
    # Hand-rolled rather than argparse: everything after SCRIPT (or -m MODULE) belongs to the
    # script, options included, exactly as with the python command.
    if not argv or argv[0] != "run":
        return None
    opts: Dict[str, object] = {"job": None, "socket": None, "every": 1, "module": None, "target": []}
    rest = argv[1:]
    while rest:
        arg = rest.pop(0)
        if arg in ("--job", "--socket", "--every") and rest:
            value = rest.pop(0)
            opts[arg[2:]] = int(value) if arg == "--every" else value
        elif arg == "-m" and rest:
            opts["module"] = rest.pop(0)
            opts["target"] = rest
            return opts
        elif arg.startswith("-"):
            return None
        else:
            opts["target"] = [arg] + rest
            return opts
    return None


def main(argv: Optional[List[str]] = None) -> int:
    try:
        opts = _parse(sys.argv[1:] if argv is None else argv)
    except ValueError:
        opts = None
    if opts is None:
        sys.stderr.write(USAGE)
        return 2

    from . import attach

    attach(job=opts["job"], socket=opts["socket"], every=opts["every"])  # type: ignore[arg-type]
    target: List[str] = opts["target"]  # type: ignore[assignment]
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
