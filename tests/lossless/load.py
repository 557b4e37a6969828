#!/usr/bin/env python3
"""Trainers for the lossless-restart proof: N real clients (the zero-dependency gpumon_client,
each its own connection and instance) sending one sample per step at HZ steps a second until
STOP exists, then bye. Writes what each client says it sent and gave up to OUT (JSON): steps
(one sample each, numbered 1..steps), lines numbered, and what the client dropped, forgot
unacknowledged, or held back under the daemon's rate limit.

    load.py SOCKET N HZ STOP OUT
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

from gpumon_client import Client, StaticStatsSource  # noqa: E402

STATS = {"allocated_bytes.all.current": 2 << 30, "reserved_bytes.all.current": 3 << 30, "num_alloc_retries": 0}


def main() -> None:
    sock, n, hz, stop, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    clients = [Client("lossless", rank=i, source=StaticStatsSource(STATS), socket=sock) for i in range(n)]
    period = 1.0 / hz
    step = 0
    start = time.monotonic()
    while not os.path.exists(stop):
        step += 1
        for c in clients:
            c.sample(step=step)
        # Paced to the step clock, not to the work, so a slow turn is caught up.
        delay = start + step * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    elapsed = time.monotonic() - start
    for c in clients:
        c.close(timeout=5.0)
    report = []
    for c in clients:
        st = c.transport.stats()
        report.append({
            "instance": c.transport.instance,
            "steps": step,
            "seconds": elapsed,
            "rate_skipped": st["rate_skipped"],
            "last_seq": c.transport.last_seq,
            "dropped": st["dropped"],
            "unconfirmed": st["unconfirmed"],
            "resent": st["resent"],
            "connects": st["connects"],
            "unencodable": c.transport.unencodable,
        })
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
