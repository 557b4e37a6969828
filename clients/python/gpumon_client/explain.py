"""The former path of `explain` (README: `gpumon_client.explain.explain(snapshot, ...)`): the
snapshot tools now live in gpumon_client.snapshot; this module only names them."""

from .snapshot.explain import Explanation, explain

__all__ = ["Explanation", "explain"]
