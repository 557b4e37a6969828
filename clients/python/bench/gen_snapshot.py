"""Large realistic torch.cuda.memory snapshots, written as a stream (pickle protocol 4).

    python bench/gen_snapshot.py OUT.pickle [--entries 1000000] [--segments 100000] [--depth 360]
        [--seed 1] [--fixtures DIR]

What torch writes (`_dump_snapshot` = `pickle.dump` of `_snapshot()`), at a scale no test run
reaches, shaped after the real H100 fixtures (tests/fixtures/torch-snapshots and torch-oom):
segment sizes and blocks per segment (with their size fractions and states) are drawn from the
fixtures' segments, the Python frames from their stacks, the action mix from their histories. It
is laid out as torch's pickle is: every frame a dict written once and referred to by the memo
after, a new frames list per history entry, a live block's list shared with its `alloc` entry,
the segment's empty frames list shared with its free blocks, FRAME opcodes every 64 KiB.

What the fixtures cannot give is the depth of `stacks="all"` (torch's default): C++ frames of the
allocator and the dispatcher, CPython's interpreter frames between the Python ones. Stacks here
are `--depth` frames on average, made of synthetic C++ and interpreter frames around the
fixtures' Python stacks; 360 puts 1M entries and 100k segments at about 2 GB.

The history is consistent with the segments: blocks live at the end are allocated in it (half of
them; the rest before it began), transient activations are allocated and freed on the free
blocks' addresses, one allocation site keeps a block every step (a leak), an OOM ends it, and a
few frees follow (a snapshot dumped after the exception unwound). Memory stays at a few hundred
MB whatever the size: entries are written as they are made.
"""

import argparse
import os
import pickle
import random
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures"))
FRAME_TARGET = 64 << 10

Frame = Tuple[str, int, str]  # (filename, line, name)


class Writer:
    """Protocol-4 opcodes for plain data, to a file, framed, with pickle's memo."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.cur = bytearray()
        self.memo = 0
        self.strings: Dict[str, bytes] = {}  # str -> its BINGET
        self.written = 0
        f.write(b"\x80\x04")
        self.written += 2

    def boundary(self) -> None:
        """Between two items: a FRAME ends here when it is large enough."""
        if len(self.cur) >= FRAME_TARGET:
            self.f.write(b"\x95" + struct.pack("<Q", len(self.cur)))
            self.f.write(self.cur)
            self.written += 9 + len(self.cur)
            self.cur = bytearray()

    def close(self) -> None:
        self.cur += b"."
        self.f.write(b"\x95" + struct.pack("<Q", len(self.cur)))
        self.f.write(self.cur)
        self.written += 9 + len(self.cur)

    def memoize(self) -> bytes:
        """MEMOIZE the top; returns the BINGET that refers to it."""
        self.cur += b"\x94"
        idx = self.memo
        self.memo += 1
        return get(idx)

    def str(self, s: str) -> None:
        ref = self.strings.get(s)
        if ref is not None:
            self.cur += ref
            return
        raw = s.encode("utf-8", "surrogatepass")
        self.cur += (b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + struct.pack("<I", len(raw))) + raw
        self.strings[s] = self.memoize()

    def value(self, v: Any) -> None:
        """Small plain data (settings, annotations), as pickle writes it."""
        if isinstance(v, str):
            self.str(v)
        elif v is None:
            self.cur += b"N"
        elif v is True or v is False:
            self.cur += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            self.cur += integer(v)
        elif isinstance(v, float):
            self.cur += b"G" + struct.pack(">d", v)
        elif isinstance(v, tuple) and len(v) <= 3:
            for x in v:
                self.value(x)
            self.cur += bytes([0x84 + len(v)]) if v else b")"
            self.memoize()
        elif isinstance(v, list):
            self.cur += b"]"
            self.memoize()
            self.items(v, lambda x: self.value(x))
        elif isinstance(v, dict):
            self.cur += b"}"
            self.memoize()
            self.pairs(list(v.items()))
        else:
            raise TypeError(type(v))

    def items(self, seq: Sequence[Any], put: Any) -> None:
        """List fills as pickle writes them: one APPEND for a single item, else MARK/APPENDS batches."""
        if len(seq) == 1:
            put(seq[0])
            self.cur += b"a"
            return
        for i in range(0, len(seq), 1000):
            self.cur += b"("
            for x in seq[i: i + 1000]:
                put(x)
                self.boundary()
            self.cur += b"e"

    def pairs(self, kv: List[Tuple[str, Any]]) -> None:
        if len(kv) == 1:
            self.str(kv[0][0])
            self.value(kv[0][1])
            self.cur += b"s"
            return
        self.cur += b"("
        for k, v in kv:
            self.str(k)
            self.value(v)
        self.cur += b"u"


def get(idx: int) -> bytes:
    return b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx)


def integer(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(1 << 31) <= v < 1 << 31:
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


# --- shapes from the fixtures ------------------------------------------------------------------


class Shapes:
    def __init__(self, root: str) -> None:
        self.segments: List[Tuple[int, List[Tuple[float, str]]]] = []  # (total, [(size share, state)])
        self.py_stacks: List[List[Frame]] = []
        self.actions: Dict[str, int] = {}
        self.settings: Dict[str, Any] = {}
        seen = set()
        for sub in ("torch-snapshots", "torch-oom"):
            d = os.path.join(root, sub)
            for name in sorted(os.listdir(d)):
                if not name.endswith(".pickle"):
                    continue
                with open(os.path.join(d, name), "rb") as f:
                    snap = pickle.load(f)  # the repository's own fixtures, plain data
                self.settings = snap.get("allocator_settings") or self.settings
                for seg in snap["segments"]:
                    total = seg["total_size"]
                    self.segments.append((total, [(b["size"] / total, b["state"]) for b in seg["blocks"]]))
                    for b in seg["blocks"]:
                        self._stack(b.get("frames"), seen)
                for trace in snap["device_traces"]:
                    for e in trace:
                        self.actions[e["action"]] = self.actions.get(e["action"], 0) + 1
                        self._stack(e.get("frames"), seen)

    def _stack(self, frames: Any, seen: set) -> None:
        if frames:
            st = tuple((f["filename"], f["line"], f["name"]) for f in frames)
            if st not in seen:
                seen.add(st)
                self.py_stacks.append(list(st))


_NS = ["at::native", "at::cuda", "c10::cuda::CUDACachingAllocator::Native", "at::_ops", "c10::impl",
       "torch::autograd", "torch::autograd::generated", "at::detail", "c10::Dispatcher", "torch::jit"]
_OPS = ["add", "mul", "matmul", "addmm", "linear", "gelu", "layer_norm", "softmax", "dropout", "cat", "copy_",
        "empty", "empty_strided", "native_layer_norm_backward", "mm", "bmm", "scaled_dot_product_attention",
        "embedding", "index_select", "sum", "mean", "where", "to", "clone", "contiguous", "view", "reshape"]
_CPP_FILES = ["aten/src/ATen/native/cuda/", "c10/cuda/", "aten/src/ATen/core/", "torch/csrc/autograd/",
              "aten/src/ATen/", "torch/csrc/autograd/generated/"]
_INTERP = [("_PyEval_EvalFrameDefault", "Python/ceval.c"), ("_PyFunction_Vectorcall", "Objects/call.c"),
           ("PyObject_Call", "Objects/call.c"), ("_PyObject_MakeTpCall", "Objects/call.c"),
           ("method_vectorcall", "Objects/classobject.c"), ("slot_tp_call", "Objects/typeobject.c")]


def cpp_frames(rng: random.Random, n: int) -> List[Frame]:
    out = []
    for i in range(n):
        ns, op, path = rng.choice(_NS), rng.choice(_OPS), rng.choice(_CPP_FILES)
        name = "%s::%s_%s(at::Tensor const&, c10::ArrayRef<long>, c10::optional<c10::ScalarType>)" % (ns, op, rng.choice(["impl", "out", "kernel", "fn", "wrapper"]))
        out.append(("/opt/pytorch/pytorch/%s%s.cpp" % (path, op.capitalize()), rng.randrange(40, 4000), name))
    return out


def make_stacks(shapes: Shapes, rng: random.Random, depth: int, count: int) -> List[List[Frame]]:
    """`count` stacks of about `depth` frames: a C++ chain (allocator, op, dispatch), then each
    Python frame of a fixture stack with interpreter frames between, then the process's start."""
    cpp = cpp_frames(rng, 6000)
    interp = [("/usr/local/src/conda/python-3.11/%s" % f, rng.randrange(100, 6000), n)
              for n, f in _INTERP for _ in range(20)]
    start = [("??", 0, "main"), ("??", 0, "__libc_start_main"), ("??", 0, "_start")]
    chains = [rng.sample(cpp, depth) for _ in range(300)]
    stacks = []
    for _ in range(count):
        py = [(fn, line + rng.choice((0, 0, 0, 1, 2, 10)), name) for fn, line, name in rng.choice(shapes.py_stacks)]
        body: List[Frame] = []
        for f in py:
            body.append(f)
            body += rng.sample(interp, 3)
        n_cpp = max(1, int(rng.gauss(depth, depth / 8)) - len(body) - len(start))
        stacks.append(rng.choice(chains)[:n_cpp] + body + start)
    return stacks


# --- the snapshot ------------------------------------------------------------------------------


class Gen:
    def __init__(self, w: Writer, stacks: List[List[Frame]], rng: random.Random) -> None:
        self.w, self.rng = w, rng
        # Frames by number (tuples of long strings hash slowly), stacks as lists of numbers.
        table: Dict[Frame, int] = {}
        self.stacks = [[table.setdefault(f, len(table)) for f in st] for st in stacks]
        self.table = [f for f, _ in sorted(table.items(), key=lambda kv: kv[1])]
        self.frame_ref: List[Optional[bytes]] = [None] * len(self.table)
        self.runs: Dict[int, bytes] = {}  # stack index -> MARK refs APPENDS, once its frames are written

    def frame(self, n: int) -> None:
        ref = self.frame_ref[n]
        if ref is not None:
            self.w.cur += ref
            return
        f = self.table[n]
        w = self.w
        w.cur += b"}"
        ref = w.memoize()
        w.cur += b"("
        w.str("name")
        w.str(f[2])
        w.str("filename")
        w.str(f[0])
        w.str("line")
        w.cur += integer(f[1])
        w.cur += b"u"
        self.frame_ref[n] = ref

    def frames(self, i: Optional[int]) -> bytes:
        """A new frames list (of stack i, or empty); returns its BINGET."""
        w = self.w
        w.cur += b"]"
        ref = w.memoize()
        if i is None:
            return ref
        run = self.runs.get(i)
        if run is not None:
            w.cur += run
            return ref
        stack = self.stacks[i]
        w.items(stack, self.frame)
        refs: List[bytes] = [self.frame_ref[f] or b"" for f in stack]
        self.runs[i] = (b"".join([b"(" + b"".join(refs[j: j + 1000]) + b"e" for j in range(0, len(refs), 1000)])
                        if len(refs) > 1 else refs[0] + b"a")
        return ref


def generate(out: str, entries: int, n_segments: int, depth: int, seed: int, fixtures: str) -> Dict[str, Any]:
    rng = random.Random(seed)
    shapes = Shapes(fixtures)
    stacks = make_stacks(shapes, rng, depth, 4000)
    alloc_stacks = list(range(0, 3000))
    free_stacks = list(range(3000, 4000))
    leak_stack = 7
    # Segments: sizes and block layouts from the fixtures, addresses laid out in order.
    addr = 0x7F0000000000
    segs = []
    free_blocks: List[Tuple[int, int]] = []  # (addr, size)
    live: List[Tuple[int, int, int, int]] = []  # (seg, block, addr, size)
    for s in range(n_segments):
        total, layout = rng.choice(shapes.segments)
        blocks = []
        off = 0
        for j, (share, state) in enumerate(layout):
            size = total - off if j == len(layout) - 1 else max(512, int(total * share) // 512 * 512)
            blocks.append([addr + off, size, state])
            if state == "active_allocated":
                live.append((s, j, addr + off, size))
            else:
                free_blocks.append((addr + off, size))
            off += size
        segs.append((addr, total, blocks))
        addr += total + (2 << 20)
    # The history: half the live blocks allocated in it, one a step from the leak's site.
    steps = max(10, entries // 2000)
    in_window = {}  # (seg, block) -> (step, stack)
    for s, j, a, size in live:
        if rng.random() < 0.5:
            leak = rng.random() < 0.6
            in_window[(s, j)] = (rng.randrange(steps), leak_stack if leak else rng.choice(alloc_stacks))
    f = open(out, "wb")
    w = Writer(f)
    g = Gen(w, stacks, rng)
    w.cur += b"}"
    w.memoize()
    w.cur += b"("
    w.str("segments")
    w.cur += b"]"
    w.memoize()
    block_list: Dict[Tuple[int, int], bytes] = {}

    def segment(s: int) -> None:
        a, total, blocks = segs[s]
        active = sum(b[1] for b in blocks if b[2] == "active_allocated")
        w.cur += b"}"
        w.memoize()
        w.cur += b"("
        for k, v in (("device", 0), ("address", a), ("total_size", total), ("allocated_size", active),
                     ("active_size", active), ("requested_size", active), ("stream", 0),
                     ("segment_type", "small" if total <= 2 << 20 else "large"), ("segment_pool_id", (0, 0)),
                     ("is_expandable", False)):
            w.str(k)
            w.value(v)
        w.str("frames")
        empty = g.frames(None)
        w.str("blocks")
        w.cur += b"]"
        w.memoize()

        def block(j: int) -> None:
            ba, size, state = blocks[j]
            w.cur += b"}"
            w.memoize()
            w.cur += b"("
            for k, v in (("address", ba), ("size", size), ("requested_size", size), ("state", state)):
                w.str(k)
                w.value(v)
            w.str("frames")
            if state == "active_allocated":
                st = in_window.get((s, j), (0, rng.choice(alloc_stacks)))[1]
                block_list[(s, j)] = g.frames(st)
            else:
                w.cur += empty
            w.cur += b"u"

        w.items(range(len(blocks)), block)
        w.cur += b"u"

    w.items(range(n_segments), segment)
    # device_traces: one device.
    w.str("device_traces")
    w.cur += b"]"
    w.memoize()
    w.cur += b"]"
    w.memoize()
    by_step: Dict[int, List[Tuple[int, int]]] = {}
    for key, (step, _st) in in_window.items():
        by_step.setdefault(step, []).append(key)
    t = 1_795_000_000_000_000
    marks: List[int] = []
    keys_common = ("stream", 0), ("compile_context", "N/A"), ("user_metadata", "")
    count = 0

    def entry(action: str, a: Optional[int], size: int, frames: Optional[int], shared: Optional[bytes] = None,
              device_free: Optional[int] = None) -> None:
        nonlocal t, count
        t += rng.randrange(3, 40)
        w.cur += b"}"
        w.memoize()
        w.cur += b"("
        w.str("action")
        w.str(action)
        if a is not None:
            w.str("addr")
            w.cur += integer(a)
        w.str("size")
        w.cur += integer(size)
        if device_free is not None:
            w.str("device_free")
            w.cur += integer(device_free)
        for k, v in keys_common[:1]:
            w.str(k)
            w.value(v)
        w.str("time_us")
        w.cur += integer(t)
        for k, v in keys_common[1:]:
            w.str(k)
            w.value(v)
        w.str("frames")
        if shared is not None:
            w.cur += shared
        else:
            g.frames(frames)
        w.cur += b"u"
        w.boundary()
        count += 1

    budget = entries - 8  # the OOM and what follows it
    seg_allocs = [s for s in range(n_segments) if rng.random() < 0.02]
    per_step = max(3, budget // steps)
    w.cur += b"("
    in_batch = 0

    def flush_batch() -> None:
        nonlocal in_batch
        if in_batch >= 1000:
            w.cur += b"e("
            in_batch = 0

    for step in range(steps):
        if count >= budget:
            break
        marks.append(t + 1)
        for s in seg_allocs[step::steps]:
            if count < budget:
                entry("segment_alloc", segs[s][0], segs[s][1], rng.choice(alloc_stacks))
                in_batch += 1
                flush_batch()
        for key in by_step.get(step, ()):
            if count < budget:
                s, j = key
                ba, size, _ = segs[s][2][j]
                entry("alloc", ba, size, None, shared=block_list[key])
                in_batch += 1
                flush_batch()
        # Activations: allocated, then freed in reverse (free_requested, free_completed).
        n = max(1, (min(per_step, budget - count)) // 3)
        acts = rng.sample(free_blocks, min(n, len(free_blocks)))
        for ba, size in acts:
            entry("alloc", ba, size, rng.choice(alloc_stacks))
            in_batch += 1
            flush_batch()
        for ba, size in reversed(acts):
            for action in ("free_requested", "free_completed"):
                if count < budget:
                    entry(action, ba, size, rng.choice(free_stacks))
                    in_batch += 1
                    flush_batch()
    # The OOM (more than the largest free block, the device nearly full), then frees as the
    # exception unwinds.
    ask = (max(size for _, size in free_blocks) + (4 << 20)) // (2 << 20) * (2 << 20)
    entry("oom", None, ask, 3, device_free=80 << 20)
    for ba, size in rng.sample(free_blocks, 3):
        entry("free_requested", ba, size, rng.choice(free_stacks))
        entry("free_completed", ba, size, rng.choice(free_stacks))
    w.cur += b"e"
    w.cur += b"a"  # the trace into device_traces
    w.str("allocator_settings")
    w.value(shapes.settings)
    w.str("external_annotations")
    w.cur += b"]"
    w.memoize()
    ann = []
    for m in marks:
        ann.append({"stage": "START", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": m})
        ann.append({"stage": "END", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": m + 1})
    w.items(ann, w.value)
    w.cur += b"u"
    w.close()
    f.close()
    blocks = sum(len(b) for _, _, b in segs)
    return {"bytes": os.path.getsize(out), "entries": count, "segments": n_segments, "blocks": blocks,
            "live_blocks": len(live), "stacks": len(stacks), "frames": sum(r is not None for r in g.frame_ref), "steps": len(marks)}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--segments", type=int, default=100_000)
    p.add_argument("--depth", type=int, default=360, help="frames per stack, on average")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fixtures", default=FIXTURES)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    info = generate(a.out, a.entries, a.segments, a.depth, a.seed, a.fixtures)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    print(" ".join("%s=%s" % kv for kv in info.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
