"""A trainer whose memory outside PyTorch's caching allocator grows while its tensors stay flat:
after --flat-steps steps, each step takes --chunk-mib MiB with the CUDA driver's own cuMemAlloc
(through ctypes, as a library with an allocator of its own would) and keeps it, up to --most-gib.
nvidia-smi counts that memory; torch.cuda.memory_stats() does not. The daemon's ledger should
count it as outside the allocator and raise untracked_growth, not a leak."""

from __future__ import annotations

import ctypes

import trainer_common as tc


def driver_api() -> ctypes.CDLL:
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemAlloc_v2.restype = ctypes.c_int
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuMemFree_v2.restype = ctypes.c_int
    return cuda


def main() -> None:
    p = tc.parser(__doc__, seconds=60)
    p.add_argument("--flat-steps", type=int, default=300, help="steps before the growth starts (past the daemon's warm-up)")
    p.add_argument("--chunk-mib", type=tc.positive_float, default=4.0)
    p.add_argument("--most-gib", type=tc.positive_float, default=6.0)
    p.add_argument("--step-ms", type=tc.positive_float, default=50.0)
    args = p.parse_args()
    torch_device = tc.setup(args)
    if torch_device.type != "cuda":
        p.error("needs a GPU: the growth is real device memory taken with cuMemAlloc")
    import torch

    model = tc.mlp(torch, 256, 2, torch_device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=torch_device)
    # The runtime made the device's primary context current on this thread; cuMemAlloc uses it.
    torch.cuda.synchronize()
    cuda = driver_api()
    chunk, most = int(args.chunk_mib * tc.MIB), int(args.most_gib * tc.GIB)
    held = []
    first_raw_step = None
    clock = tc.Clock(args.seconds, args.stop_file)
    steps = 0
    try:
        while clock.running():
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if steps >= args.flat_steps and (len(held) + 1) * chunk <= most:
                ptr = ctypes.c_uint64()
                rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), chunk)
                if rc != 0:
                    raise SystemExit("%s: cuMemAlloc of %d bytes failed with CUresult %d" % (tc.prog(), chunk, rc))
                held.append(ptr.value)
                first_raw_step = steps if first_raw_step is None else first_raw_step
            steps += 1
            clock.pace(args.step_ms / 1000.0)
        tc.sync(torch, torch_device)
        result = {
            "steps": steps,
            "seconds": clock.elapsed(),
            "step_ms": args.step_ms,
            "chunk_bytes": chunk,
            "raw_chunks": len(held),
            "raw_bytes": len(held) * chunk,
            "first_raw_step": first_raw_step,
            "device_total": tc.device_total(torch, torch_device),
            **tc.allocator_counters(torch, torch_device),
        }
    finally:
        for ptr in held:
            cuda.cuMemFree_v2(ptr)
    tc.write_result(args.result, result)


if __name__ == "__main__":
    main()
