#!/usr/bin/env python3
"""What the attached client adds to a real PyTorch training step, on CPU.

Runs a real training loop (real model, real optimizer, torch's real optimizer step post-hook
dispatch) bare and with gpumon_client.attach(), taking turns of 4 steps, at five CPU-bound step
lengths (about 0.2 ms with plain SGD, then 0.35 ms, 0.4 ms, 3 ms and 100 ms with AdamW, on one
thread, depending on the machine) and two GPU-bound ones as the CPU thread sees them (a 0.8 ms
step's launches, then a spin-wait for the device, to 5 ms and 100 ms). The client runs its real
code path: the cadence, TorchStatsSource picking keys from torch's nested allocator stats, JSON,
the non-blocking socket to a live reader in another process.
Only the CUDA driver is stood in (there is no GPU here): memory_stats_as_nested_dict returns the
allocator's ~130 counters and, with --stats-cost-us, busy-waits that long per call, to charge each
sample what torch.cuda.memory_stats() costs on a real GPU (about 180 us measured on an H100).

Each round, bare and attached take turns of 4 steps (one step at steps over 5 ms) in a new random
order at every turn, 1 s of steps each: the machine's speed drifts at every time scale, and only
arms that take turns within a few steps see the same machine (bench/turns.py). The attached
arm's cadence and write schedule read a clock that runs only in its turns, so it is sampled as a
trainer that never paused would be.

Reports per step length: samples taken, the client's own time per step measured inside its hook,
and the whole cost: the mean per-round difference in step time, attached minus bare, with a
95 % bootstrap interval, two ways. Wall time is what a trainer waits, but on a shared machine it carries
every other process's scheduling; the training thread's CPU time (torch runs on one thread here)
counts the same work, the client's hook, cadence, JSON and socket write, cache misses included,
without the time the thread spent descheduled, so its interval resolves a budget of a few us
where wall time cannot. The verdict is by the CPU-time interval; the wall one is printed beside
it. Budget: the whole cost <= 1 % of a step under 1 ms, <= 0.5 % of a longer one, <= 25 us.

    $(scripts/torch-venv newest)/bin/python clients/python/bench/bench_client.py [--stats-cost-us 180]

--parts takes the whole cost apart in the same rounds (torch's dispatch of an empty hook; the
client with sampling ruled out; the client with its cadence's decisions but its samples doing
nothing; the client writing each sample at once, write_every=0); --tail
STEPS times attached steps one by one, around real samples and around phantom ones (sample()
doing nothing), to show what a sample costs its own step and the steps after it, beside the time
inside client.sample().
"""

import argparse
import gc
import importlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import gpumon_client  # noqa: E402
from gpumon_client import TorchStatsSource, hooks  # noqa: E402
from gpumon_client.cadence import Cadence  # noqa: E402
from gpumon_client.testing import nested_allocator_stats  # noqa: E402
from turns import on_own_clock, take_turns  # noqa: E402 (bench/turns.py, beside this file)

# (name, width, batch, optimizer, wait): a Linear-ReLU-Linear MLP; step lengths from about 0.2 ms
# (plain SGD, the shortest step torch's Python optimizer path allows here) to 100 ms. The `wait`
# shapes are a GPU-bound step as its CPU thread sees it: the launches (the tiny AdamW step's CPU
# work), then `wait` seconds waiting for the device between backward and the optimizer step, as a
# loss.item() waits. CUDA's default synchronisation spins while a process has fewer contexts than
# the machine has cores, so the wait spins too, for a fixed span of the thread's CPU time: the
# step's CPU time then varies only by its launches, and the client's time adds to the step in full,
# as if the device waited for it (on a GPU it overlaps the queued kernels). A 5 ms or 100 ms step
# whose difference carries the noise of a 0.8 ms one, where a CPU-bound step that long carries its
# own (the `medium` and `large` shapes).
SHAPES = (
    ("sgd", 8, 1, "sgd", 0.0),
    ("tiny", 8, 1, "adamw", 0.0),
    ("small", 32, 8, "adamw", 0.0),
    ("medium", 384, 128, "adamw", 0.0),
    ("large", 1024, 1024, "adamw", 0.0),
    ("wait5", 8, 1, "adamw", 0.0042),
    ("wait100", 8, 1, "adamw", 0.0992),
)


def serve(path):
    """A daemon stand-in in its own process: accepts, answers welcome, reads and discards."""
    import threading

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)

    def drain(conn):
        conn.sendall(b'{"type":"welcome","v":1,"server":"bench","session":"s-1"}\n')
        while conn.recv(1 << 20):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def stand_in_cuda(cost_us):
    """Patches the driver-backed calls TorchStatsSource makes; everything else stays torch's."""
    nested = nested_allocator_stats()
    spin = cost_us / 1e6

    def memory_stats_as_nested_dict(device=None):
        end = time.perf_counter() + spin
        while time.perf_counter() < end:
            pass
        return nested

    memory = importlib.import_module("torch.cuda.memory")
    memory.memory_stats_as_nested_dict = memory_stats_as_nested_dict
    torch.cuda.mem_get_info = lambda device=None: (40 << 30, 80 << 30)
    torch.cuda.get_per_process_memory_fraction = lambda device=None: 1.0
    torch.cuda.get_device_properties = lambda device=None: type("P", (), {"uuid": None})()
    torch.cuda.get_allocator_backend = lambda: "native"


def device_wait(seconds):
    """Spins for `seconds` of this thread's CPU time, as CUDA's default synchronisation spins."""
    clock = time.thread_time
    end = clock() + seconds
    while clock() < end:
        pass


def make_loop(width, batch, optimizer="adamw", wait=0.0):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        if wait:
            device_wait(wait)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed_hook(inner):
    """Wraps the client's hook to accumulate the time spent inside it (the client's own cost)."""
    spent = [0.0]

    def hook(optimizer, args, kwargs):
        t0 = time.perf_counter()
        inner(optimizer, args, kwargs)
        spent[0] += time.perf_counter() - t0

    return hook, spent


def block(step, n):
    """Seconds per step over n steps: (wall, this thread's CPU)."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n, (time.thread_time() - c0) / n


def interval(diffs, rng, resamples=2000):
    """Mean of the per-round differences and a 95 % bootstrap interval of it. The mean, not the
    median: the cost is amortised, and at long steps a round holds one or two samples, so the
    median round is the one with the usual count and misses the rest."""
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choice(diffs) for _ in range(n)) for _ in range(resamples))
    return statistics.fmean(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def budget_us(step_us):
    """The documented budget for the client's whole cost: 1 % of a step under 1 ms, 0.5 % of a
    longer one, never more than 25 us per step."""
    return min((0.01 if step_us < 1000 else 0.005) * step_us, 25.0)


class NoSamples:
    """A cadence that never samples: the attachment's step path (torch's dispatch, the hook's
    countdown, a decision every 250 steps) without the samples, for --parts."""

    def __init__(self):
        self.wait = 0

    def due(self, steps=1):
        self.wait = hooks._MAX_LEFT
        return False


def empty_hook(optimizer, args, kwargs):
    """What torch's dispatch of any step post-hook costs, for --parts."""


def tail_chunk(step, state, register, client_hook, steps, phantom, acc):
    """`steps` attached steps, each step's CPU time taken, into `acc`: the steps' times, their
    distance from the last sample, the time inside `client.sample`, writes, seconds and garbage
    collections. phantom: `sample()` does nothing, so the same steps by the same cadence carry
    everything but the sample."""
    client = state.client
    sample = client.sample

    def timed_sample(*args, **kwargs):
        t0 = time.thread_time()
        if not phantom:
            sample(*args, **kwargs)
        acc["inside"] += time.thread_time() - t0

    client.sample = timed_sample  # an instance attribute: the hook looks it up on the client
    cadence = state.cadence
    clock = time.thread_time
    times, dist = acc["times"], acc["dist"]
    # A sample is counted where it is taken (samples wait to be written together).
    d, last = 1 << 30, cadence._samples
    writes, wall = getattr(client.transport, "writes", 0), time.perf_counter()
    # Whether Python's garbage collector runs in the loop (what a sample allocates could set it
    # off): collections by generation.
    collections = acc["collections"]

    def collected(phase, info):
        if phase == "stop":
            collections[info["generation"]] += 1

    gc.callbacks.append(collected)
    handle = register(client_hook)
    try:
        for _ in range(steps):
            t0 = clock()
            step()
            times.append(clock() - t0)
            taken = cadence._samples
            d = 0 if taken != last else d + 1
            last = taken
            dist.append(d)
    finally:
        handle.remove()
        gc.callbacks.remove(collected)
        del client.sample
    acc["writes"] += getattr(client.transport, "writes", 0) - writes
    acc["seconds"] += time.perf_counter() - wall


def excess_by_distance(times, dist):
    """The excess µs of a step at each distance 0..7 from a sample, then of the steps 8-63
    summed, over the mean of the steps 64 or more after one."""
    far = [t for t, k in zip(times, dist) if k >= 64]
    base = statistics.fmean(far) if far else float("nan")
    buckets = [[t for t, k in zip(times, dist) if k == i] for i in range(8)]
    buckets.append([t for t, k in zip(times, dist) if 8 <= k < 64])
    excess = [(statistics.fmean(b) - base) * 1e6 if b else float("nan") for b in buckets]
    excess[8] *= 56  # steps 8-63 after a sample: their summed excess, not the mean of one
    return excess


def tail(step, state, register, client_hook, steps, rng, chunks=8):
    """What a sample costs the loop, step by step, for --tail: `steps` attached steps with real
    samples and as many around phantom ones (`sample()` doing nothing, the same cadence), in
    `chunks` shuffled pairs. Steps far from a sample are not a fair baseline alone: samples come
    by the clock, so a stretch of slow steps holds fewer steps between two samples and the far
    ones come more from fast stretches; the phantom arm carries the same bias, and the
    difference is what the sample costs. Returns a dict of both arms' excess by distance, their
    difference, the samples, the mean µs inside sample(), writes per second and collections."""
    arms = {arm: {"times": [], "dist": [], "inside": 0.0, "writes": 0, "seconds": 0.0, "collections": [0, 0, 0]}
            for arm in ("real", "phantom")}
    per = max(1, steps // chunks)
    for _ in range(chunks):
        order = ["real", "phantom"]
        rng.shuffle(order)
        for arm in order:
            tail_chunk(step, state, register, client_hook, per, arm == "phantom", arms[arm])
    real, phantom = arms["real"], arms["phantom"]
    samples = real["dist"].count(0)
    excess = excess_by_distance(real["times"], real["dist"])
    ghost = excess_by_distance(phantom["times"], phantom["dist"])
    return {
        "samples": samples,
        "inside_us": real["inside"] / samples * 1e6 if samples else float("nan"),
        "excess": excess,
        "phantom": ghost,
        "cost": [a - b for a, b in zip(excess, ghost)],
        "writes_per_s": real["writes"] / real["seconds"] if real["seconds"] else float("nan"),
        "collections": [a + b for a, b in zip(real["collections"], phantom["collections"])],
    }


def tail_row(e):
    """One line of --tail's excess by distance from a sample."""
    return "own step %+.0f, next seven %s, steps 8-63 %+.0f in all; %+.0f in all" % (
        e[0], " ".join("%+.0f" % x for x in e[1:8]), e[8], sum(e))


def run_shape(name, width, batch, optimizer, wait, rounds, block_s, sock, rng, parts=False, tail_steps=0,
              write_every=None, steps_per_turn=4):
    step = make_loop(width, batch, optimizer, wait)
    for _ in range(20):
        step()
    per_step = block(step, 20)[0]
    # A turn of at most about 5 ms (or one step): long steps need no company to share a machine.
    k = max(1, min(steps_per_turn, int(0.005 / per_step)))
    turns = max(2, int(block_s / per_step / k))
    # source= only because CUDA is unavailable here: TorchStatsSource on the stand-in driver.
    state = gpumon_client.attach(job="bench", socket=sock, source=TorchStatsSource(0))
    if write_every is not None:
        state.client.transport.write_every = write_every
    state._hook_handle.remove()
    client = state.client
    transport = client.transport
    write_every = getattr(transport, "write_every", 0.0)  # an older client has none
    register = importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook
    # Each client arm is an attachment of its own (its own cadence on its own clock, its own
    # countdown), so no arm's state carries into another's turn. With --parts: an empty hook
    # (torch's dispatch alone), the client's step path with sampling ruled out (a cadence that
    # never samples, on the attached arm's client: it writes nothing), and the client writing
    # each sample at once (a client of its own, write_every=0).
    arms = ["bare", "attached"] + (["empty", "no_samples", "phantom", "at_once"] if parts else [])
    attachment = {"attached": state}
    if parts:
        attachment["no_samples"] = hooks.Attachment(client, NoSamples())
        # The phantom arm: the shipped cadence and step path, its samples doing nothing.
        phantom = gpumon_client.Client("bench-phantom", socket=sock, source=TorchStatsSource(0))
        phantom.sample = lambda step=None, phase=None: None
        attachment["phantom"] = hooks.Attachment(phantom)
        at_once = gpumon_client.Client("bench-at-once", socket=sock, source=TorchStatsSource(0), write_every=0)
        attachment["at_once"] = hooks.Attachment(at_once)
    clocks = {arm: on_own_clock(attachment[arm]) for arm in ("attached", "phantom", "at_once") if arm in attachment}
    hook_of = {arm: att.hook for arm, att in attachment.items()}
    hook_of["empty"] = empty_hook
    bare, diffs, cpu_diffs = [], [], []
    part_diffs = {"empty": [], "no_samples": [], "phantom": [], "at_once": []}
    attached_time, attached_writes = 0.0, 0
    # Rounds of `turns` turns per arm, `k` steps a turn, the arms in a new random order at every
    # turn (bench/turns.py: the machine's speed drifts at every time scale, and only arms
    # that take turns within a few steps see the same machine). A round's difference is its
    # arm's steps against its bare ones.
    arm_of = {arm: (hook_of.get(arm), clocks.get(arm)) for arm in arms}
    writes = (lambda: transport.writes) if hasattr(transport, "writes") else None
    take_turns(step, arm_of, k, 2, rng, register)  # untimed: each client connects at its first sample
    samples0 = state.cadence._samples
    for _ in range(rounds):
        t = take_turns(step, arm_of, k, turns, rng, register, count=writes)
        n = turns * k
        bare.append(t["bare"][0] / n)
        diffs.append((t["attached"][0] - t["bare"][0]) / n * 1e6)
        cpu_diffs.append((t["attached"][1] - t["bare"][1]) / n * 1e6)
        for arm in part_diffs:
            if arm in t:
                part_diffs[arm].append((t[arm][1] - t["bare"][1]) / n * 1e6)
        attached_time += t["attached"][0]
        attached_writes += t["attached"][2]
    attached_samples = state.cadence._samples - samples0
    # Back to a trainer's clock for the rest: the hook's own time and --tail.
    transport._monotonic = time.monotonic
    if hasattr(transport, "_last_write"):
        transport._last_write = -float("inf")
    state.cadence = Cadence()
    client_hook = state.hook
    n = max(20, int(block_s / per_step))
    # The client's own time, inside its hook, in a few blocks of their own (the wrapper's timing
    # would add to the end-to-end figure).
    hook, spent = timed_hook(client_hook)
    handle = register(hook)
    # Untimed until the new cadence has sampled twice: its first sample is charged but leaves no
    # estimate, which at long steps would hold a few blocks' worth of its budget.
    for _ in range(max(100, int(30.0 / per_step))):
        if state.cadence._samples >= 2:
            break
        step()
    spent[0] = 0.0
    own_blocks = max(2, rounds // 10)
    for _ in range(own_blocks):
        block(step, n)
    handle.remove()
    own = spent[0] / (own_blocks * n)
    tailed = tail(step, state, register, client_hook, tail_steps, rng) if tail_steps else None
    gpumon_client.detach(timeout=0.2)
    if parts:
        at_once.close(timeout=0.2)
        phantom.close(timeout=0.2)
    hooks._oom_observer_installed = False
    b = statistics.median(bare)
    med, lo, hi = interval(diffs, rng)
    cmed, clo, chi = interval(cpu_diffs, rng)
    return {
        "cpu_us": cmed,
        "cpu_lo_us": clo,
        "cpu_hi_us": chi,
        "shape": name,
        "step_us": b * 1e6,
        "own_us": own * 1e6,
        "e2e_us": med,
        "lo_us": lo,
        "hi_us": hi,
        "budget_us": budget_us(b * 1e6),
        "samples_per_s": attached_samples / attached_time,
        "writes_per_s": attached_writes / attached_time,
        "parts": {arm: interval(d, rng) for arm, d in part_diffs.items() if d},
        "tail": tailed,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stats-cost-us", type=float, default=70.5,
                    help="what one memory_stats call costs on the GPU being modelled (default 70.5: "
                         "an H100, torch 2.11)")
    ap.add_argument("--rounds", type=int, default=30, help="shuffled bare/attached rounds per step length (default 30)")
    ap.add_argument("--block", type=float, default=1.0,
                    help="seconds of each arm's steps per round (default 1.0: about ten samples a round)")
    ap.add_argument("--turn", type=int, default=4, metavar="STEPS",
                    help="steps an arm runs before the next one takes its turn (default 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shape", action="append", choices=[s[0] for s in SHAPES],
                    help="only this step length (repeatable; default: all)")
    ap.add_argument("--parts", action="store_true",
                    help="also take the whole cost apart, in the same shuffled rounds: torch's dispatch of "
                         "an empty hook, the client's step path with sampling ruled out, the client with its "
                         "samples doing nothing, and the client writing each sample at once (CPU time)")
    ap.add_argument("--tail", type=int, default=0, metavar="STEPS",
                    help="also run STEPS attached steps timed one by one, around real samples and as many "
                         "around phantom ones: what a sample costs its own step and the steps after it, "
                         "beside the time inside sample()")
    ap.add_argument("--write-every", type=float, default=None, metavar="SECONDS",
                    help="the client's write_every (default: the client's own, 0.5; 0 writes each sample at once)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    stand_in_cuda(args.stats_cost_us)
    rng = random.Random(args.seed)

    tmp = tempfile.mkdtemp(prefix="gpm-bench")
    sock = os.path.join(tmp, "ingest.sock")
    server = subprocess.Popen([sys.executable, __file__, "--serve", sock], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        print("torch %s, memory_stats charged %.1f us per call, 1 thread, %d rounds of %.2f s per arm in shuffled "
              "turns of %d steps; "
              "budget: the whole cost <= 1 %% of a step under 1 ms, <= 0.5 %% of a longer one, <= 25 us"
              % (torch.__version__, args.stats_cost_us, args.rounds, args.block, args.turn))
        print("%-7s %9s %10s %26s %26s %9s %10s %9s  %s" % (
            "step", "bare us", "hook us", "CPU: whole cost us (95% CI)", "wall: whole cost us (95% CI)",
            "budget us", "samples/s", "writes/s", "verdict (CPU)"))
        verdicts = []
        for name, width, batch, optimizer, wait in SHAPES:
            if args.shape and name not in args.shape:
                continue
            r = run_shape(name, width, batch, optimizer, wait, args.rounds, args.block, sock, rng, args.parts,
                          args.tail, args.write_every, args.turn)
            if r["cpu_hi_us"] <= r["budget_us"]:
                verdict = "within"
            elif r["cpu_lo_us"] > r["budget_us"]:
                verdict = "OVER"
            else:
                verdict = "unresolved (the interval straddles the budget: more --rounds)"
            verdicts.append(verdict)
            print("%-7s %9.1f %10.2f %8.1f (%+7.1f..%+7.1f) %8.1f (%+7.1f..%+7.1f) %9.1f %10.2f %9.2f  %s" % (
                r["shape"], r["step_us"], r["own_us"], r["cpu_us"], r["cpu_lo_us"], r["cpu_hi_us"],
                r["e2e_us"], r["lo_us"], r["hi_us"], r["budget_us"], r["samples_per_s"], r["writes_per_s"],
                verdict))
            for arm, label in (("empty", "an empty hook"), ("no_samples", "the client, sampling ruled out"),
                               ("phantom", "the client, its samples doing nothing"),
                               ("at_once", "the client, each sample written at once")):
                if arm in r["parts"]:
                    print("  %-40s %8.1f (%+7.1f..%+7.1f)  CPU us over bare" % ((label + ":",) + r["parts"][arm]))
            if r["tail"]:
                t = r["tail"]
                print("  a sample (%d): %.0f us inside sample(); %.1f writes/s; garbage collections "
                      "(generation 0, 1, 2) %d, %d, %d" % ((t["samples"], t["inside_us"], t["writes_per_s"])
                                                           + tuple(t["collections"])))
                print("    steps over steps far from a sample, us:   %s" % tail_row(t["excess"]))
                print("    the same around a phantom sample, us:     %s" % tail_row(t["phantom"]))
                print("    the difference, what a sample costs, us:  %s" % tail_row(t["cost"]))
        ok = all(v == "within" for v in verdicts)
        print("budget met (whole cost, by its interval):", "yes" if ok else "NO")
        return 0 if ok else 1
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(main())
