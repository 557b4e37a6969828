"""Environment switches, read when used so tests (and trainers) can set them late."""

import os
from typing import Mapping, Optional


def disabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """GPUMON_DISABLE=1 (or true/yes/on) turns the whole client into no-ops."""
    env = os.environ if env is None else env
    return env.get("GPUMON_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def int_env(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    env = os.environ if env is None else env
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None
