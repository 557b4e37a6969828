"""The analyses' results fitted into one protocol line (docs/protocol.md): an attribution's or a
peak's sites, and the explanation an `oom` event carries."""

import json
from typing import Any, Dict, List

from .explain import Explanation

__all__ = ["MAX_SITES", "MAX_STACK", "MAX_STR", "MAX_NOTES", "fit", "for_wire"]

# The protocol's limits (docs/protocol.md, the attribution message and the oom event).
MAX_SITES = 20
MAX_STACK = 32
MAX_STR = 512
MAX_NOTES = 8  # reasons and remedies sent to the daemon, at most


def cap(s: Any) -> Any:
    """A string cut to MAX_STR bytes of UTF-8 on a character boundary; anything else as it is."""
    if not isinstance(s, str):
        return s
    # "replace" also turns lone surrogates (possible in a pickle) into "?", which JSON parsers
    # that insist on valid UTF-8 would refuse.
    b = s.encode("utf-8", "replace")
    return b[:MAX_STR].decode("utf-8", "ignore") if len(b) > MAX_STR else b.decode("utf-8")


def json_size(obj: Any) -> int:
    return len(json.dumps(obj))  # ASCII (escapes): bytes = characters, never under the UTF-8 size


def fit(sites_json: List[Dict[str, Any]], budget: int) -> List[Dict[str, Any]]:
    """A copy of `sites_json` (Site.as_json() dicts, largest first) that fits the protocol: strings
    at most 512 bytes, stacks at most 32 frames, at most 20 sites, and `json.dumps` of the list at
    most `budget` bytes, got by dropping outer frames (from the longest stacks first), then the
    smallest sites."""
    sites = []
    for s in sites_json[:MAX_SITES]:
        d = {k: cap(v) for k, v in s.items() if k != "stack"}
        d["stack"] = [{k: cap(v) for k, v in f.items()} for f in (s.get("stack") or [])[:MAX_STACK]]
        sites.append(d)
    lens = [json_size(d) for d in sites]

    def total() -> int:
        return 2 + sum(lens) + 2 * max(0, len(lens) - 1)  # "[" "]" and ", " between

    size = total()
    while size > budget:
        longest = max(range(len(sites)), key=lambda i: (len(sites[i]["stack"]), i), default=None)
        if longest is None or not sites[longest]["stack"]:
            break
        stack = sites[longest]["stack"]
        gone = json_size(stack.pop()) + (2 if stack else 0)
        lens[longest] -= gone
        size -= gone
    while size > budget and sites:
        sites.pop()
        lens.pop()
        size = total()
    return sites


def for_wire(ex: Explanation, budget: int) -> Dict[str, Any]:
    """The explanation as the `oom` event carries it (docs/protocol.md): strings at most 512
    bytes, at most 8 reasons and remedies, sites and stacks trimmed (stacks first) so that
    `json.dumps` of the result is at most `budget` bytes."""
    d = ex.as_json()
    d["reasons"] = [cap(r) for r in ex.reasons[:MAX_NOTES]]
    d["remedies"] = [cap(r) for r in ex.remedies[:MAX_NOTES]]
    d["message"] = cap(ex.message)
    if ex.failing_site is not None:
        fs = {k: cap(v) for k, v in ex.failing_site.items() if k != "stack"}
        fs["stack"] = [{k: cap(v) for k, v in f.items()} for f in ex.failing_site.get("stack", [])[:MAX_STACK]]
        d["failing_site"] = fs
    d["live_sites"] = []
    rest = budget - json_size(d)
    d["live_sites"] = fit([s.as_json() for s in ex.live_sites], max(2, rest + 2))
    while json_size(d) > budget and (d["reasons"] or (d["failing_site"] or {}).get("stack")):
        if d["failing_site"] and len(d["failing_site"]["stack"]) > 1:
            d["failing_site"]["stack"].pop()
        elif d["reasons"]:
            d["reasons"].pop()
        else:
            break
    return d
