#!/usr/bin/env python3
"""A stand-in trainer for checking that a package upgrade keeps the ingest socket
(packaging/upgrade-check.md). For SECONDS it runs one gpumon_client session sending a sample every
50 ms, and a probe that connects to the socket every 20 ms; then it prints one line:

  steps=... connects=2 dropped=0 unconfirmed=0 probes_ok=... probe_failures=0 socket_inode_same=True

An upgrade that keeps gpumon.socket shows probe_failures=0 and socket_inode_same=True (the
listening socket never went away); the session reconnected to the new daemon (connects=2) and
lost nothing (dropped=0 unconfirmed=0). Exit status 1 when any of that does not hold.

Usage: PYTHONPATH=/usr/share/gpumon/python python3 upgrade-check-trainer.py SECONDS [SOCKET]
(run as root or as a member of the gpumon group).
"""

import os
import socket
import sys
import threading
import time

from gpumon_client import Client, StaticStatsSource


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    duration = float(sys.argv[1])
    path = sys.argv[2] if len(sys.argv) == 3 else "/run/gpumon/ingest.sock"
    stop = time.monotonic() + duration
    failures = []
    probes = [0]

    def probe() -> None:
        while time.monotonic() < stop:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                probes[0] += 1
            except OSError as e:
                failures.append("%s %s" % (time.strftime("%H:%M:%S"), e.strerror))
            finally:
                s.close()
            time.sleep(0.02)

    inode = os.stat(path).st_ino
    prober = threading.Thread(target=probe)
    prober.start()
    # Fixed numbers: what matters is that the lines get through, not what they say.
    source = StaticStatsSource(
        stats={"allocated_bytes.all.current": 1 << 30, "reserved_bytes.all.current": 2 << 30},
        mem_info=(60 << 30, 80 << 30),
    )
    client = Client(job="upgrade-check", source=source, socket=path, attribution=False)
    step = 0
    while time.monotonic() < stop:
        client.sample(step=step)
        step += 1
        time.sleep(0.05)
    prober.join()
    # Time to reconnect and have the last lines acknowledged.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = client.stats()
        if st.get("connected") and not st.get("buffered"):
            break
        time.sleep(0.1)
    st = client.stats()
    client.close()
    same = os.path.exists(path) and os.stat(path).st_ino == inode
    print(
        "steps=%d connects=%s dropped=%s unconfirmed=%s probes_ok=%d probe_failures=%d socket_inode_same=%s"
        % (step, st.get("connects"), st.get("dropped"), st.get("unconfirmed"), probes[0], len(failures), same)
    )
    for f in failures[:5]:
        print("  probe failed at", f)
    ok = not failures and same and not st.get("dropped") and not st.get("unconfirmed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
