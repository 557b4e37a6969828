"""What the Lightning and transformers tests check alike: a trainer with gradient accumulation 2,
validation every 2 global steps, 4 global steps in all, limits on the cadence off."""

from support import check_sample_payload, of_type, summary

GLOBAL_STEPS = 4
ACCUMULATE = 2
EXACT = {"max_rate": None, "budget": None}


def check_trainer_session(msgs, job):
    """One sample per global step (train), samples during validation marked eval, bye last."""
    hello = msgs[0]
    assert hello["type"] == "hello" and hello["job"] == job
    assert msgs[-1]["type"] == "bye" and len(of_type(msgs, "bye")) == 1
    samples = of_type(msgs, "sample")
    for sample in samples:
        check_sample_payload(sample)
    train = [m["step"] for m in samples if m["phase"] == "train"]
    assert train == list(range(1, GLOBAL_STEPS + 1)), summary(msgs)
    evals = [i for i, m in enumerate(msgs) if m["type"] == "sample" and m["phase"] == "eval"]
    assert evals, "no sample was taken during validation: %s" % summary(msgs)
    # The first validation runs after global step 2 and before step 3.
    index = {m["step"]: i for i, m in enumerate(msgs) if m["type"] == "sample" and m["phase"] == "train"}
    assert index[2] < evals[0] < index[3], summary(msgs)
    assert {m["phase"] for m in samples} == {"train", "eval"}
