"""Environment switches, read when used so tests (and trainers) can set them late."""

import os
from typing import Mapping, Optional

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def disabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """GPUMON_DISABLE=1 (or true/yes/on) turns the whole client into no-ops."""
    return flag("GPUMON_DISABLE", env) is True


def flag(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[bool]:
    """True for 1/true/yes/on, False for 0/false/no/off, None when unset or anything else."""
    env = os.environ if env is None else env
    value = env.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return None


# The daemon refuses a longer run_id (protocol.md); a longer one is cut, never raised on.
RUN_ID_MAX_BYTES = 128

# Every variable a launcher sets that ends up in the hello (run_id, restart, rank, world_size, job).
# Tests and the fixture generator clear them, so output under srun or torchrun is what it is elsewhere.
HELLO_VARS = (
    "GPUMON_JOB", "RANK", "WORLD_SIZE",
    "GPUMON_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
)


def run_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The run this rank belongs to, the same on every rank of one run (the daemon groups ranks
    into a job by it): $GPUMON_RUN_ID, $TORCHELASTIC_RUN_ID (torchrun), $SLURM_JOB_ID with
    .$SLURM_STEP_ID when set (srun), MASTER_ADDR:MASTER_PORT when both are set; else None.
    Empty values, and torchrun's default "none" (the same for every static multi-node run), count
    as unset: the next source is used."""
    env = os.environ if env is None else env

    def get(name: str) -> str:
        value = env.get(name, "").strip()
        return "" if no_run_id(value) else value

    value = get("GPUMON_RUN_ID") or get("TORCHELASTIC_RUN_ID")
    if not value and get("SLURM_JOB_ID"):
        step = get("SLURM_STEP_ID")
        value = get("SLURM_JOB_ID") + ("." + step if step else "")
    if not value and get("MASTER_ADDR") and get("MASTER_PORT"):
        value = get("MASTER_ADDR") + ":" + get("MASTER_PORT")
    return clip_run_id(value) or None


def no_run_id(value: str) -> bool:
    """Whether `value` names no run: empty, or torchrun's default run id "none"."""
    return value.strip().lower() in ("", "none")


def clip_run_id(value: str) -> str:
    """`value` cut to RUN_ID_MAX_BYTES of UTF-8, on a character boundary (never raises: a longer
    run_id is cut rather than refused, since the trainer must not fail over a label)."""
    # "ignore" both ways: a str from os.environ may hold lone surrogates (bytes that were not
    # UTF-8), which cannot be encoded; they are dropped. Cutting the bytes may split the last
    # character; decoding drops that partial character, so the result is whole characters only.
    raw = value.encode("utf-8", "ignore")
    return raw[:RUN_ID_MAX_BYTES].decode("utf-8", "ignore")


def alloc_conf(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The caching allocator's settings as the trainer's torch reads them at its first CUDA
    allocation ($PYTORCH_CUDA_ALLOC_CONF, or the newer $PYTORCH_ALLOC_CONF); None when neither is
    set. Cut like a run_id: the daemon refuses a longer hello field, and the trainer must not fail
    over a hint."""
    env = os.environ if env is None else env
    value = env.get("PYTORCH_CUDA_ALLOC_CONF")
    if value is None:
        value = env.get("PYTORCH_ALLOC_CONF")
    return None if value is None else clip_run_id(value)


def restart_count(env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """torchelastic's restart count ($TORCHELASTIC_RESTART_COUNT), when a whole number >= 0."""
    n = int_env("TORCHELASTIC_RESTART_COUNT", env)
    return n if n is not None and n >= 0 else None


def int_env(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    env = os.environ if env is None else env
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None
