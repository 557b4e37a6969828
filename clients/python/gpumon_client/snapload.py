"""The former path of the snapshot loader (README: `gpumon_client.snapload.load(path, keep=...,
budget=...)`): the snapshot tools now live in gpumon_client.snapshot; this module only names them."""

from .snapshot.load import DEFAULT_BUDGET, SnapshotError, load, loads, validate

__all__ = ["SnapshotError", "DEFAULT_BUDGET", "load", "loads", "validate"]
