"""Messages of the gpumon ingest protocol, version 1 (docs/protocol.md), and their wire form.

Everything here is pure: no sockets, no torch. Message builders return dicts, typed by
messages.py, and are the only place each message is built; `encode` turns one into a
newline-terminated UTF-8 line that fits the protocol's 64 KiB limit.
"""

import json
import math
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, cast

from ._version import __version__
from .messages import Armed, Attribution, Bye, Categories, Event, Hello, Peak, Sample, SiteJson

VERSION = 1
CLIENT = "gpumon-py/" + __version__
MAX_LINE = 65536  # bytes, newline included
MAX_BATCH = 1 << 24  # the largest `categories.batch_size` the daemon takes (its batch fit's bound)

# The memory_stats() keys the protocol names. Samples carry these by default: the full dict has
# ~150 keys the daemon would ignore, and each costs serialisation time on every step.
KNOWN_STATS_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "requested_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
)

EVENT_KINDS = ("oom", "phase", "mark", "snapshot")
ERROR_CODES = (
    "bad_json",
    "line_too_long",
    "no_hello",
    "unsupported_version",
    "unknown_type",
    "bad_field",
    "rate_limited",
)

# What a client can do when asked (hello `caps`), and the limits of the `attribution` answer.
CAP_ATTRIBUTION = "attribution"
CAP_OOM_HISTORY = "oom_history"  # `arm`: keep allocation history recording while an OOM is coming
CAP_ACK = "ack"  # lines carry `seq`; the daemon acknowledges them; unacknowledged ones are resent
ATTRIBUTION_ERRORS = ("unavailable", "failed", "cut_short")
MAX_STR = 512  # bytes in file, function, note and detail strings
MAX_SITES = 20
MAX_STACK = 32
MAX_ENTRIES = 100000  # the most allocation-history entries a request may ask the client to keep

# Compact separators keep lines short; allow_nan=False because NaN is not JSON.
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# Optional fields are omitted rather than sent as null: the contract calls them optional. The
# builders test each one inline (no helper call), as a sample is built at every sampled step.


def hello(
    pid: int,
    job: Optional[str] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    cuda_device: Optional[int] = None,
    gpu_uuid: Optional[str] = None,
    torch: Optional[str] = None,
    allocator: Optional[str] = None,
    expandable_segments: Optional[bool] = None,
    client: Optional[str] = CLIENT,
    alloc_limit: Optional[int] = None,
    caps: Optional[Sequence[str]] = None,
    run_id: Optional[str] = None,
    restart: Optional[int] = None,
    alloc_conf: Optional[str] = None,
) -> Hello:
    msg: Hello = {"type": "hello", "v": VERSION, "pid": pid}
    if job is not None:
        msg["job"] = job
    if rank is not None:
        msg["rank"] = rank
    if world_size is not None:
        msg["world_size"] = world_size
    if cuda_device is not None:
        msg["cuda_device"] = cuda_device
    if gpu_uuid is not None:
        msg["gpu_uuid"] = gpu_uuid
    if client is not None:
        msg["client"] = client
    if torch is not None:
        msg["torch"] = torch
    if allocator is not None:
        msg["allocator"] = allocator
    if expandable_segments is not None:
        msg["expandable_segments"] = expandable_segments
    if alloc_limit is not None:
        msg["alloc_limit"] = alloc_limit
    if caps:
        msg["caps"] = list(caps)
    if run_id is not None:
        msg["run_id"] = run_id
    if restart is not None:
        msg["restart"] = restart
    if alloc_conf is not None:
        msg["alloc_conf"] = alloc_conf
    return msg


def pick_stats(stats: Mapping[str, Any], keys: Optional[Iterable[str]] = KNOWN_STATS_KEYS) -> Dict[str, Any]:
    """The subset of a memory_stats() dict to send; keys=None sends all of it."""
    if keys is None:
        return dict(stats)
    return {k: stats[k] for k in keys if k in stats}


def sample(
    ts: float,
    stats: Mapping[str, Any],
    step: Optional[int] = None,
    phase: str = "train",
    device_free: Optional[int] = None,
    device_total: Optional[int] = None,
    alloc_limit: Optional[int] = None,
    categories: Optional[Categories] = None,
) -> Sample:
    """A `sample`: the one place a sample message is built (every caller goes through here).
    `categories`: the split measured at this step (`categories()`), on the rare measured step."""
    # `step` goes between `ts` and `phase` on the wire: the two literals keep that key order.
    if step is None:
        msg: Sample = {"type": "sample", "ts": ts, "phase": phase, "stats": stats}
    else:
        msg = {"type": "sample", "ts": ts, "step": step, "phase": phase, "stats": stats}
    if device_free is not None:
        msg["device_free"] = device_free
    if device_total is not None:
        msg["device_total"] = device_total
    if alloc_limit is not None:
        msg["alloc_limit"] = alloc_limit
    if categories is not None:
        msg["categories"] = categories
    return msg


MAX_PARTIAL = 8  # reasons a split may carry


def categories(
    step: int,
    parameters_bytes: int,
    gradients_bytes: int,
    optimizer_state_bytes: int,
    buffers_bytes: int,
    activations_bytes: int,
    batch_size: Optional[int],
    partial: Optional[Sequence[str]] = None,
    fp32_bytes: Optional[int] = None,
) -> Categories:
    """A sample's `categories` (design/categories.md): bytes as integers, `batch_size` an integer
    or null (always present), `fp32_bytes` (of the parameters and gradients, those in float32)
    when given, `partial` (reasons, each at most MAX_STR bytes) only when known partial. The
    daemon refuses the whole sample for a batch past MAX_BATCH or fp32_bytes above parameters and
    gradients: a first dimension that large (a packed token stream) is sent as unknown, and the
    float32 figure is kept within its bound."""
    if batch_size is not None and int(batch_size) > MAX_BATCH:
        batch_size = None
    msg: Categories = {
        "step": int(step),
        "parameters_bytes": int(parameters_bytes),
        "gradients_bytes": int(gradients_bytes),
        "optimizer_state_bytes": int(optimizer_state_bytes),
        "buffers_bytes": int(buffers_bytes),
        "activations_bytes": int(activations_bytes),
        "batch_size": None if batch_size is None else int(batch_size),
    }
    if fp32_bytes is not None:
        msg["fp32_bytes"] = min(int(fp32_bytes), int(parameters_bytes) + int(gradients_bytes))
    if partial:
        msg["partial"] = [clip(str(reason)) for reason in list(partial)[:MAX_PARTIAL]]
    return msg


def event(ts: float, kind: str, **fields: Any) -> Event:
    """An `event`; fields that are None are left out. Any field may be added (the daemon ignores
    the ones it does not know), so the message is built as a plain dict and typed as an Event."""
    msg: Dict[str, Any] = {"type": "event", "ts": ts, "kind": kind}
    for key, value in fields.items():
        if value is not None:
            msg[key] = value
    return cast(Event, msg)


def oom_event(
    ts: float, alloc_bytes: int, device_free: Optional[int], detail: str, alloc_limit: Optional[int] = None
) -> Event:
    return event(ts, "oom", alloc_bytes=alloc_bytes, device_free=device_free, alloc_limit=alloc_limit, detail=detail)


def phase_event(ts: float, phase: str) -> Event:
    return event(ts, "phase", phase=phase)


def mark_event(ts: float, detail: str, **extra: Any) -> Event:
    return event(ts, "mark", detail=detail, **extra)


def snapshot_event(ts: float, path: str) -> Event:
    return event(ts, "snapshot", path=path)


def dropped_mark(ts: float, dropped: int) -> Event:
    """How the client reports lines it dropped while the daemon was down or slow.

    A `mark` event is the contract's free-form annotation; `dropped` is an extra field, which
    the contract allows (unknown fields are ignored), so a daemon can count it without parsing
    the detail text.
    """
    return mark_event(ts, "gpumon-client dropped %d line(s) while the daemon was unreachable" % dropped, dropped=dropped)


def bye(ts: float) -> Bye:
    return {"type": "bye", "ts": ts}


def clip(text: str, limit: int = MAX_STR) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, never inside a character."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore")


def _answer(id: int, ts: float, step_from: Optional[int], step_to: Optional[int],
            seconds: Optional[float]) -> Attribution:
    """What every answer to an `attribute` request starts with: its request and its window."""
    msg: Attribution = {"type": "attribution", "id": id, "ts": ts}
    if step_from is not None:
        msg["step_from"] = step_from
    if step_to is not None:
        msg["step_to"] = step_to
    if seconds is not None:
        msg["seconds"] = seconds
    return msg


def attribution(
    id: int,
    ts: float,
    total_growth_bytes: int,
    sites: List[SiteJson],
    step_from: Optional[int] = None,
    step_to: Optional[int] = None,
    seconds: Optional[float] = None,
) -> Attribution:
    """The answer to an `attribute` request: the window's growth and its top sites."""
    msg = _answer(id, ts, step_from, step_to, seconds)
    msg["total_growth_bytes"] = int(total_growth_bytes)
    msg["sites"] = sites
    return msg


def attribution_error(
    id: int,
    ts: float,
    error: str,
    detail: str,
    step_from: Optional[int] = None,
    step_to: Optional[int] = None,
    seconds: Optional[float] = None,
) -> Attribution:
    """The answer to an `attribute` request the client could not fulfil (ATTRIBUTION_ERRORS)."""
    msg = _answer(id, ts, step_from, step_to, seconds)
    msg["error"] = error
    msg["detail"] = clip(detail)
    return msg


def _finite(value: Any) -> Any:
    # Replaces what JSON cannot carry (NaN, inf, odd types) instead of losing the whole line.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


def encode(msg: Mapping[str, Any]) -> Optional[bytes]:
    """One protocol line, or None when the message cannot be made to fit."""
    try:
        text = _encoder.encode(msg)
    except (TypeError, ValueError):
        text = _encoder.encode(_finite(msg))
    line = text.encode("utf-8", "replace") + b"\n"
    if len(line) <= MAX_LINE:
        return line
    return _shrink(dict(msg))


def _shrink(msg: Dict[str, Any]) -> Optional[bytes]:
    # Only oversized free text or a stats="all" dict can push a line past the limit.
    if isinstance(msg.get("stats"), dict):
        msg["stats"] = pick_stats(msg["stats"])
    for key in ("detail", "path", "job"):
        if isinstance(msg.get(key), str) and len(msg[key]) > 1024:
            msg[key] = msg[key][:1024]
    line = _encoder.encode(_finite(msg)).encode("utf-8", "replace") + b"\n"
    return line if len(line) <= MAX_LINE else None


class Reply(NamedTuple):
    """A line from the daemon: `welcome` or `error` (or a type this client does not know)."""

    type: str
    session: Optional[str] = None
    server: Optional[str] = None
    v: Optional[int] = None
    code: Optional[str] = None
    line: Optional[int] = None
    message: Optional[str] = None


def parse_line(raw: bytes) -> Optional[Dict[str, Any]]:
    """One line from the daemon as a JSON object with a string `type`; None for anything else."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    return obj


# A field of a daemon line when it has the protocol's type, else None. bool is an int to Python,
# never to the protocol.


def _int(obj: Mapping[str, Any], key: str) -> Optional[int]:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(obj: Mapping[str, Any], key: str) -> Optional[float]:
    value = obj.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(obj: Mapping[str, Any], key: str) -> Optional[str]:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def parse_reply(raw: bytes) -> Optional[Reply]:
    """Parses one reply line; None for anything that is not a JSON object with a string type."""
    obj = parse_line(raw)
    return None if obj is None else reply_of(obj)


def reply_of(obj: Mapping[str, Any]) -> Reply:
    return Reply(
        type=obj["type"],
        session=_str(obj, "session"),
        server=_str(obj, "server"),
        v=_int(obj, "v"),
        code=_str(obj, "code"),
        line=_int(obj, "line"),
        message=_str(obj, "message"),
    )


class AttributeRequest(NamedTuple):
    """An `attribute` request from the daemon. `problem` is set (and the rest may be defaults)
    when the request has a usable id but cannot be followed; the client answers `failed` then."""

    id: int
    v: int = 1
    finding: Optional[str] = None
    steps: Optional[int] = None
    seconds: Optional[float] = None
    max_entries: int = 4000
    top: int = 10
    problem: Optional[str] = None


def parse_request(obj: Mapping[str, Any]) -> Optional[AttributeRequest]:
    """An `attribute` request, or None when it has no usable `id` (then nothing can answer it).

    `steps` and `seconds` bound the window, whichever ends first; one of them may be absent.
    `max_entries` is capped at MAX_ENTRIES and `top` at MAX_SITES.
    """
    rid = _int(obj, "id")
    if rid is None or rid < 0:
        return None
    v = _int(obj, "v")
    if v is None and "v" in obj:
        return AttributeRequest(rid, problem="bad request: v must be an integer")
    if v is not None and v != 1:
        return AttributeRequest(rid, v=v, problem="attribute request version %d not supported (this client speaks 1)" % v)
    finding = _str(obj, "finding")
    steps = _int(obj, "steps")
    seconds = _number(obj, "seconds")
    problems: List[str] = []
    if "steps" in obj and (steps is None or steps < 1):
        problems.append("steps must be a positive integer")
    if "seconds" in obj and (seconds is None or not math.isfinite(seconds) or seconds <= 0):
        problems.append("seconds must be a positive number")
    if steps is None and seconds is None and not problems:
        problems.append("neither steps nor seconds bounds the window")
    max_entries = _int(obj, "max_entries")
    if "max_entries" in obj and (max_entries is None or max_entries < 1):
        problems.append("max_entries must be a positive integer")
    top = _int(obj, "top")
    if "top" in obj and (top is None or top < 1):
        problems.append("top must be a positive integer")
    return AttributeRequest(
        id=rid,
        v=1,
        finding=clip(finding) if finding else None,
        steps=steps if steps is not None and steps >= 1 else None,
        seconds=float(seconds) if seconds is not None and math.isfinite(seconds) and seconds > 0 else None,
        max_entries=min(max_entries or 4000, MAX_ENTRIES),
        top=min(top or 10, MAX_SITES),
        problem=("bad request: " + "; ".join(problems)) if problems else None,
    )


class ArmRequest(NamedTuple):
    """An `arm` (or, with `disarm` set, a `disarm`) request. `problem` as for AttributeRequest:
    the client answers `failed` with it."""

    id: int
    disarm: bool = False
    finding: Optional[str] = None
    seconds: float = 900.0
    max_entries: int = 20000
    peak_after_steps: int = 0
    problem: Optional[str] = None


def parse_arm(obj: Mapping[str, Any]) -> Optional[ArmRequest]:
    """An `arm` or `disarm` request, or None when it has no usable `id`."""
    rid = _int(obj, "id")
    if rid is None or rid < 0:
        return None
    v = _int(obj, "v")
    if "v" in obj and v != 1:
        return ArmRequest(rid, problem="%s request version %r not supported (this client speaks 1)" % (obj.get("type"), obj.get("v")))
    if obj.get("type") == "disarm":
        return ArmRequest(rid, disarm=True)
    problems: List[str] = []
    seconds = _number(obj, "seconds")
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        problems.append("seconds must be a positive number")
    max_entries = _int(obj, "max_entries")
    if "max_entries" in obj and (max_entries is None or max_entries < 1):
        problems.append("max_entries must be a positive integer")
    peak = _int(obj, "peak_after_steps")
    if "peak_after_steps" in obj and (peak is None or peak < 0):
        problems.append("peak_after_steps must be a whole number")
    finding = _str(obj, "finding")
    return ArmRequest(
        id=rid,
        finding=clip(finding) if finding else None,
        seconds=float(seconds) if seconds is not None and math.isfinite(seconds) and seconds > 0 else 900.0,
        max_entries=min(max_entries or 20000, MAX_ENTRIES),
        peak_after_steps=peak if peak is not None and peak > 0 else 0,
        problem=("bad request: " + "; ".join(problems)) if problems else None,
    )


def armed(id: int, ts: float, error: Optional[str] = None, detail: Optional[str] = None) -> Armed:
    """The answer to an `arm` request: recording, or why not (`unavailable`, `failed`)."""
    msg: Armed = {"type": "armed", "id": int(id), "ts": ts}
    if error is not None:
        msg["error"] = error
        msg["detail"] = clip(detail or "")
    return msg


def peak(id: int, ts: float, peak_bytes: Optional[int], sites: List[SiteJson], step_from: Optional[int] = None,
         step_to: Optional[int] = None, error: Optional[str] = None, detail: Optional[str] = None) -> Peak:
    """What was live at the step's peak while armed (docs/protocol.md, `arm`)."""
    msg: Peak = {"type": "peak", "id": int(id), "ts": ts}
    if step_from is not None:
        msg["step_from"] = step_from
    if step_to is not None:
        msg["step_to"] = step_to
    if error is not None:
        msg["error"] = error
        msg["detail"] = clip(detail or "")
        return msg
    msg["peak_bytes"] = int(peak_bytes or 0)
    msg["sites"] = sites
    return msg


def format_gpu_uuid(uuid: Any) -> Optional[str]:
    """A device UUID as NVML spells it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").

    torch's `_CUDAuuid` has `.bytes` (16 raw bytes); its str() is the bare hex form without the
    "GPU-" prefix NVML uses, so both are normalised. MIG instance ids ("MIG-...") pass through.
    """
    if uuid is None:
        return None
    raw = getattr(uuid, "bytes", None)
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
        h = bytes(raw).hex()
    else:
        text = str(uuid).strip()
        if text.startswith("MIG-"):
            return text
        if text.startswith("GPU-"):
            text = text[4:]
        h = text.replace("-", "").lower()
        if len(h) != 32 or any(c not in "0123456789abcdef" for c in h):
            return str(uuid).strip() or None
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])
