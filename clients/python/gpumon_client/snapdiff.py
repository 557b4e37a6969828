"""The former path of `diff` (README: `from gpumon_client.snapdiff import load, diff`): the
snapshot tools now live in gpumon_client.snapshot; this module only names them."""

from .snapshot.diff import Report, Site, diff
from .snapshot.load import SnapshotError, load, loads
from .snapshot.wire import fit

__all__ = ["SnapshotError", "load", "loads", "diff", "fit", "Site", "Report"]
