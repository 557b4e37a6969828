"""Tests of what corpus/live.py lets pass as the documented read-batch exception."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from live import batch_exception  # noqa: E402

GROWS = "allocated floor grows 1.6 MiB/step since step 288 (+452.8 MiB so far)"
CLAUSE = "; no line is named: the trainer's client does not record allocation history (its hello announced no `attribution`)"
ETA = "; at this rate the GPU is full in ~1h25m (step ~16,000)"


def leak(state, message, step=573):
    return ("leak", step, "warning", state, message)


def test_a_resolved_leak_with_the_clause_offline_only_is_the_exception():
    live = {leak("resolved", GROWS + ETA), leak("resolved", GROWS + CLAUSE + ETA, 654)}
    offline = {leak("resolved", GROWS + CLAUSE + ETA), leak("resolved", GROWS + CLAUSE + ETA, 654)}
    assert batch_exception(live, offline)


def test_any_other_difference_is_not():
    offline = {leak("resolved", GROWS + CLAUSE + ETA)}
    # The clause live only: the other way round.
    assert not batch_exception({leak("resolved", GROWS + CLAUSE + ETA)}, {leak("resolved", GROWS + ETA)})
    # A firing leak: the daemon asks after the batch, so it has the clause live too.
    assert not batch_exception({leak("firing", GROWS + ETA)}, {leak("firing", GROWS + CLAUSE + ETA)})
    # Another field, another message, a finding more or less.
    assert not batch_exception({leak("resolved", GROWS + ETA, 574)}, offline)
    assert not batch_exception({leak("resolved", "allocated floor grows 2.0 MiB/step" + ETA)}, offline)
    assert not batch_exception(set(), offline)
    assert not batch_exception({leak("resolved", GROWS + ETA), ("oom", 600, "critical", "firing", "x")}, offline)
