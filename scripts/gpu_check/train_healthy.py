"""A healthy trainer: a small MLP, fixed batch, Adam, steps paced to --step-ms. Its allocated
floor is flat after the first step (optimizer state), so gpumon must raise nothing for it."""

from __future__ import annotations

import trainer_common as tc


def main() -> None:
    p = tc.parser(__doc__, seconds=40)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--step-ms", type=tc.positive_float, default=10.0)
    args = p.parse_args()
    torch_device = tc.setup(args)
    import torch

    model = tc.mlp(torch, args.width, 4, torch_device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=torch_device)
    clock = tc.Clock(args.seconds, args.stop_file)
    steps = 0
    loss_sum = 0.0
    while clock.running():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 50 == 0:
            loss_sum += loss.item()  # a scalar, not the tensor: nothing kept across steps
        clock.pace(args.step_ms / 1000.0)
    tc.sync(torch, torch_device)
    tc.write_result(args.result, {"steps": steps, "seconds": clock.elapsed(), **tc.allocator_counters(torch, torch_device)})


if __name__ == "__main__":
    main()
