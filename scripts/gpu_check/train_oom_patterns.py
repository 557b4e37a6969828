"""Three real CUDA OOMs in one trainer, one per pattern, under a capped allocator with allocation
history recorded (the way tests/fixtures/torch-oom was made): pressure (one request larger than
the cap), fragmentation (7 MiB survivors pin every 20 MiB segment, then a request larger than any
free block), leak (each step keeps a copy of its output until the cap is reached). The trainer
catches each OOM and goes on, so all three are survived. Its result file names the lines that
matter (found by their `# expect:` markers), for the check to compare with the daemon's
explanations. Needs CUDA: there is no caching allocator to run out of on the CPU."""

from __future__ import annotations

import re

import trainer_common as tc


def expected_lines() -> dict:
    """`# expect: NAME` markers in this file, by name: the line numbers the check looks for."""
    out = {}
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            m = re.search(r"\S.*#\s*expect:\s*(\w+)\s*$", line)
            if m:
                out[m.group(1)] = n
    return out


def ask_too_much(torch, dev, cap):
    return torch.empty(2 * cap // 4, device=dev)  # expect: pressure_failing


def pin_pieces(torch, dev, n):
    return [torch.empty(7 * tc.MIB // 4, device=dev) for _ in range(n)]  # expect: fragmentation_top


def ask_big(torch, dev, nbytes):
    return torch.empty(nbytes // 4, device=dev)  # expect: fragmentation_failing


def keep(kept, out):
    kept.append(out.detach().clone())  # expect: leak_top


def main() -> None:
    p = tc.parser(__doc__, seconds=60)
    p.add_argument("--cap", type=float, default=4.0, help="allocator cap in GiB (default %(default)s)")
    args = p.parse_args()
    dev = tc.setup(args)
    if dev.type != "cuda":
        raise SystemExit("%s: needs CUDA (real OOMs of the caching allocator)" % tc.prog())
    import torch

    torch.cuda.memory._record_memory_history(max_entries=100000, context="alloc", stacks="python")
    cap, total = tc.cap_allocator(p, torch, dev, args.cap)
    model = tc.mlp(torch, 1024, 4, dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    clock = tc.Clock(args.seconds, args.stop_file)
    ooms, steps = [], 0

    def step(x):
        nonlocal steps
        out = model(x)
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        return out

    def caught(pattern, fn):
        try:
            fn()
        except torch.cuda.OutOfMemoryError as exc:
            ooms.append({"pattern": pattern, "step": steps, "message": str(exc).splitlines()[0][:300]})
        torch.cuda.empty_cache()

    x = torch.randn(256, 1024, device=dev)
    for _ in range(20):
        step(x)
    caught("pressure", lambda: ask_too_much(torch, dev, cap))
    for _ in range(10):
        step(x)

    def fragment():
        pieces = pin_pieces(torch, dev, 360)
        survivors = pieces[::2]
        del pieces
        try:
            ask_big(torch, dev, 3 * cap // 8)
        finally:
            del survivors

    caught("fragmentation", fragment)
    for _ in range(10):
        step(x)

    kept = []
    big = torch.randn(8192, 1024, device=dev)  # a 32 MiB output a step

    def leak():
        while clock.running():
            keep(kept, step(big))
            clock.pace(0.01)

    caught("leak", leak)
    kept.clear()
    for _ in range(20):
        step(x)
    torch.cuda.memory._record_memory_history(enabled=None)
    tc.sync(torch, dev)
    tc.write_result(args.result, {"steps": steps, "seconds": clock.elapsed(), "cap": cap, "device_total": total,
                                  "ooms": ooms, "lines": expected_lines(), "file": __file__.rsplit("/", 1)[-1]})
    missing = {"pressure", "fragmentation", "leak"} - {o["pattern"] for o in ooms}
    if missing:
        raise SystemExit("%s: no OutOfMemoryError for %s" % (tc.prog(), ", ".join(sorted(missing))))


if __name__ == "__main__":
    main()
