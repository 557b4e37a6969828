"""A leaking trainer: after a flat start it keeps each step's output tensor in a list, so the
memory that survives a step grows by a fixed amount per step, at --leak-rate of the device's
memory per second (paced steps make the rate per second and per step both known). The result
file records when the leak began (onset step and time) and how much it leaks per step: the
ground truth that gpumon's leak finding is judged against, with the line that allocates what is
kept (`leak_site`), which gpumon's attribution should name while the trainer runs."""

from __future__ import annotations

import os
import time

import trainer_common as tc


def step_output(head, big):
    return head(big)  # allocates the step's output, the tensor the trainer then keeps: the leak's site


# Where the kept memory is allocated, as an attribution names a site (file name, line, function).
LEAK_SITE = {"file": os.path.basename(__file__), "line": step_output.__code__.co_firstlineno + 1, "function": "step_output"}


def main() -> None:
    p = tc.parser(__doc__, seconds=120)
    p.add_argument("--width", type=int, default=1024)
    # 10 ms steps: at the default cadence (a budget of 25 us per step, ~200 us per sample on a
    # GPU) that is enough steps for 10 samples per second, the most the client sends.
    p.add_argument("--step-ms", type=tc.positive_float, default=10.0)
    p.add_argument("--flat-seconds", type=float, default=10.0, help="train without leaking this long first")
    p.add_argument("--leak-rate", type=tc.fraction, default=0.0008, help="share of device memory leaked per second")
    p.add_argument("--max-leak", type=tc.fraction, default=0.15, help="stop leaking at this share of the device")
    args = p.parse_args()
    torch_device = tc.setup(args)
    import torch

    total = tc.device_total(torch, torch_device)
    per_step = int(total * args.leak_rate * args.step_ms / 1000.0)
    rows = max(1, per_step // (args.width * 4))  # the kept output is rows x width float32
    per_step = rows * args.width * 4
    model = tc.mlp(torch, args.width, 2, torch_device)
    head = torch.nn.Linear(args.width, args.width).to(torch_device)
    opt = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=1e-3)
    x = torch.randn(64, args.width, device=torch_device)
    big = torch.randn(rows, args.width, device=torch_device)
    kept = []
    clock = tc.Clock(args.seconds, args.stop_file)
    steps, onset_step, onset_ts = 0, None, None
    while clock.running():
        loss = model(x).pow(2).mean()
        out = step_output(head, big)  # the step's output, as large as the leak per step
        loss = loss + out.mean() * 0.0
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        leaking = clock.elapsed() >= args.flat_seconds and len(kept) * per_step < args.max_leak * total
        if leaking:
            if onset_step is None:
                # The floor first rises at the sample after this step: onset is this step.
                onset_step, onset_ts = steps, time.time()
            kept.append(out.detach())  # the bug: the output survives the step
        clock.pace(args.step_ms / 1000.0)
    tc.sync(torch, torch_device)
    tc.write_result(
        args.result,
        {
            "steps": steps,
            "seconds": clock.elapsed(),
            "onset_step": onset_step,
            "onset_ts": onset_ts,
            "leak_bytes_per_step": per_step,
            "leaked_bytes": len(kept) * per_step,
            "leak_site": LEAK_SITE,
            "device_total": total,
            "stopped_by_file": clock.stopped_by_file(),
            **tc.allocator_counters(torch, torch_device),
        },
    )


if __name__ == "__main__":
    main()
