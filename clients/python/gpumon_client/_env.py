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


def int_env(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    env = os.environ if env is None else env
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None
