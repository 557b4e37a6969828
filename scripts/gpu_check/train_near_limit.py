"""A trainer near its memory limit: the caching allocator is capped with
torch.cuda.set_per_process_memory_fraction, and every step takes a batch of a different size,
split into --chunks input tensors that together fill 72-94% of the cap. Blocks cached for the last
step's sizes rarely fit the next step's, and there is no room to allocate beside them, so the
allocator keeps freeing its cache and retrying cudaMalloc (num_alloc_retries rises). With 4
chunks each is at most 23.5% of the cap, so even the worst packing (each live chunk in a cached
block of the largest size) leaves room for the model and cuBLAS's workspace: the run never runs
out of memory."""

from __future__ import annotations

import random

import trainer_common as tc


def main() -> None:
    p = tc.parser(__doc__, seconds=40)
    p.add_argument("--cap", type=float, default=2.0, help="allocator cap in GiB (default %(default)s)")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--step-ms", type=tc.positive_float, default=20.0)
    args = p.parse_args()
    if args.chunks < 1:
        p.error("--chunks must be 1 or more")
    torch_device = tc.setup(args)
    import torch

    cap, total = tc.cap_allocator(p, torch, torch_device, args.cap)
    rng = random.Random(args.seed)
    row = args.width * 4
    lo, hi = int(0.72 * cap / args.chunks), int(0.94 * cap / args.chunks)
    model = tc.mlp(torch, 64, 2, torch_device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    clock = tc.Clock(args.seconds, args.stop_file)
    steps = 0
    while clock.running():
        # The batch of this step: chunk sizes vary, so cached blocks seldom fit.
        chunks = []
        with torch.no_grad():
            for _ in range(args.chunks):
                rows = rng.randint(lo, hi) // row
                chunks.append(torch.empty(rows, args.width, device=torch_device).normal_())
            feats = torch.stack([c[:, :64].mean(0) for c in chunks]).mean(0, keepdim=True)
        loss = model(feats).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del chunks, feats, loss
        steps += 1
        clock.pace(args.step_ms / 1000.0)
    tc.sync(torch, torch_device)
    tc.write_result(args.result, {"steps": steps, "seconds": clock.elapsed(), "cap": cap, "device_total": total, **tc.allocator_counters(torch, torch_device)})


if __name__ == "__main__":
    main()
