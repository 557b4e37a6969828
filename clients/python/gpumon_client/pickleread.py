"""The former path of the streaming pickle reader (README: `gpumon_client.pickleread.read(f,
Schema(spec))`): the snapshot tools now live in gpumon_client.snapshot; this module only names them."""

from .snapshot.pickleread import Limits, ReadError, read
from .snapshot.pickleschema import DROP, FRAMES, KEEP, Schema

__all__ = ["read", "Limits", "ReadError", "Schema", "KEEP", "DROP", "FRAMES"]
