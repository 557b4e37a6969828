"""A DistributedDataParallel trainer for torchrun (each rank its own gpumon session). Rank r
uses GPU r modulo the GPUs there are; with fewer GPUs than ranks they share one, which NCCL
refuses, so the ranks then talk over gloo (it all-reduces CUDA tensors too)."""

from __future__ import annotations

import os

import trainer_common as tc


def main() -> None:
    p = tc.parser(__doc__, seconds=25)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--step-ms", type=tc.positive_float, default=20.0)
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("train_ddp.py: CUDA is not available (use --device cpu for the self-test)")
        gpus = torch.cuda.device_count()
        torch.cuda.set_device(local % gpus)
        device = torch.device("cuda", local % gpus)
        backend = "nccl" if gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", world)) else "gloo"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend)
    try:
        model = tc.mlp(torch, args.width, 2, device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x = torch.randn(128, args.width, device=device)
        clock = tc.Clock(args.seconds)
        steps = 0
        # Every rank runs the same number of steps (the collective would hang otherwise): the
        # step count is fixed from the time budget, not read from each rank's clock.
        total_steps = max(1, int(args.seconds * 1000.0 / args.step_ms))
        while steps < total_steps:
            loss = ddp(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            clock.pace(args.step_ms / 1000.0)
        tc.sync(torch, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if args.result:
        base, ext = os.path.splitext(args.result)
        tc.write_result("%s.rank%d%s" % (base, rank, ext), {"steps": steps, "rank": rank, "world_size": world, "backend": backend, "device": str(device)})


if __name__ == "__main__":
    main()
