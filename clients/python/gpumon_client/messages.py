"""The messages the client sends, as types (docs/protocol.md, *Messages from the trainer*).

TypedDicts, so a message stays the plain dict that `protocol.encode` writes and the types cost
nothing at run time. Field names are the wire's and never change. Each message keeps its required
fields in a base class and its optional ones in a `total=False` subclass (typing has no per-field
`NotRequired` before Python 3.11). The builders in protocol.py insert the keys in wire order.
"""

from typing import Any, Dict, List, Literal, Mapping, Optional, TypedDict, Union

# A site of an `attribution`, a `peak` or an OOM explanation (snapshot.sites.Site.as_json), and an
# OOM explanation (snapshot.wire.for_wire): built and trimmed by the snapshot tools, typed loosely here.
SiteJson = Dict[str, Any]
ExplanationJson = Dict[str, Any]


class _HelloRequired(TypedDict):
    type: Literal["hello"]
    v: int
    pid: int


class Hello(_HelloRequired, total=False):
    job: str
    rank: int
    world_size: int
    cuda_device: int
    gpu_uuid: str
    client: str
    torch: str
    allocator: str
    expandable_segments: bool
    alloc_limit: int
    caps: List[str]
    run_id: str
    restart: int
    alloc_conf: str
    instance: str  # added by the transport with capability `ack`


class _SampleRequired(TypedDict):
    type: Literal["sample"]
    ts: float
    phase: str
    # memory_stats() keys, verbatim; the values are the allocator's (ints from torch).
    stats: Mapping[str, Any]


class _CategoriesRequired(TypedDict):
    # Where the step's memory goes (design/categories.md), measured on one step now and then:
    # bytes of this device's tensors, each storage counted once (categories.py).
    step: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    buffers_bytes: int
    activations_bytes: int
    batch_size: Optional[int]  # null when the outermost module got no tensor


class Categories(_CategoriesRequired, total=False):
    # Of parameters_bytes + gradients_bytes, the bytes stored in float32: what bf16 would halve.
    # Optional on the wire (a client before it sends none; the daemon then sizes no bf16 remedy).
    fp32_bytes: int
    # Why some figure is known to be off ("code: explanation", categories.PARTIAL_*); absent
    # when the split is whole.
    partial: List[str]


class Sample(_SampleRequired, total=False):
    step: int
    device_free: int
    device_total: int
    alloc_limit: int
    categories: Categories  # only on a step the split was measured on


class _EventRequired(TypedDict):
    type: Literal["event"]
    ts: float
    kind: str  # protocol.EVENT_KINDS, or a newer kind the daemon counts as unknown


class Event(_EventRequired, total=False):
    # Which fields go with which kind: docs/protocol.md. Client.event may add any other field
    # (the daemon ignores unknown ones), so an Event can hold keys this type does not name.
    phase: str
    detail: str
    path: str
    alloc_bytes: int
    device_free: int
    alloc_limit: int
    explanation: ExplanationJson
    dropped: int


class Bye(TypedDict):
    type: Literal["bye"]
    ts: float


class _AttributionRequired(TypedDict):
    type: Literal["attribution"]
    id: int
    ts: float


class Attribution(_AttributionRequired, total=False):
    """The answer to an `attribute` request: the sites, or `error` and `detail`."""

    step_from: int
    step_to: int
    seconds: float
    total_growth_bytes: int
    sites: List[SiteJson]
    error: str  # protocol.ATTRIBUTION_ERRORS
    detail: str


class _ArmedRequired(TypedDict):
    type: Literal["armed"]
    id: int
    ts: float


class Armed(_ArmedRequired, total=False):
    error: str
    detail: str


class _PeakRequired(TypedDict):
    type: Literal["peak"]
    id: int
    ts: float


class Peak(_PeakRequired, total=False):
    step_from: int
    step_to: int
    peak_bytes: int
    sites: List[SiteJson]
    error: str
    detail: str


# Answers to the daemon's requests: they belong to their connection and are never numbered.
Answer = Union[Attribution, Armed, Peak]
Message = Union[Hello, Sample, Event, Bye, Attribution, Armed, Peak]
