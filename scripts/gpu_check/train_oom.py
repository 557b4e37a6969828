"""A trainer that runs out of memory: the allocator is capped with
torch.cuda.set_per_process_memory_fraction, a few normal steps run, then every step keeps another
--chunk-mib tensor until torch raises OutOfMemoryError. The trainer catches it, frees what it
kept, trains a little longer (the OOM was survived) and exits cleanly. gpumon's oom finding must
name the cap (1.5 GiB by default), not the device."""

from __future__ import annotations

import trainer_common as tc


def main() -> None:
    p = tc.parser(__doc__, seconds=20)
    p.add_argument("--cap", type=float, default=1.5, help="allocator cap in GiB (default %(default)s)")
    p.add_argument("--chunk-mib", type=int, default=64)
    p.add_argument("--step-ms", type=tc.positive_float, default=50.0)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--after-steps", type=int, default=40, help="steps after the OOM, before exiting")
    args = p.parse_args()
    torch_device = tc.setup(args)
    import torch

    cap, total = tc.cap_allocator(p, torch, torch_device, args.cap)
    chunk = args.chunk_mib * tc.MIB
    model = tc.mlp(torch, 256, 2, torch_device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256, device=torch_device)
    clock = tc.Clock(args.seconds, args.stop_file)
    kept, steps, oom_step, oom_message, after = [], 0, None, None, 0

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    while clock.running():
        step()
        steps += 1
        if oom_step is None and steps > args.warmup_steps:
            try:
                if torch_device.type == "cpu" and (len(kept) + 1) * chunk > cap:
                    tc.simulate_oom(chunk, cap, total - len(kept) * chunk)
                    raise torch.cuda.OutOfMemoryError("simulated: %d bytes over the %d byte cap" % (chunk, cap))
                kept.append(torch.empty(chunk // 4, device=torch_device))
            except torch.cuda.OutOfMemoryError as exc:
                oom_step, oom_message = steps, str(exc).splitlines()[0][:300]
                kept.clear()
                if torch_device.type == "cuda":
                    torch.cuda.empty_cache()
        elif oom_step is not None:
            after += 1
            if after >= args.after_steps:
                break
        clock.pace(args.step_ms / 1000.0)
    tc.sync(torch, torch_device)
    tc.write_result(
        args.result,
        {
            "steps": steps,
            "seconds": clock.elapsed(),
            "cap": cap,
            "chunk_bytes": chunk,
            "device_total": total,
            "oom_step": oom_step,
            "oom_message": oom_message,
            **tc.allocator_counters(torch, torch_device),
        },
    )
    if oom_step is None:
        raise SystemExit("%s: no OutOfMemoryError within %.0f s" % (tc.prog(), args.seconds))


if __name__ == "__main__":
    main()
