"""Snapshot pickles are untrusted input: the reader admits plain data only, refuses anything that
would call code (and nothing runs), and says in one line which file is unusable and why."""

import copyreg
import os
import pickle
import pickletools
import subprocess
import sys

import pytest

from gpumon_client.snapshot import load as snapload
from gpumon_client.snapshot.load import SnapshotError, load, loads

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "torch-snapshots"))
PAIRS = ("leak-kept-outputs", "leak-eval-graph", "healthy")
CALLING_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD",
                   "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}


def fixture(name):
    return os.path.join(FIXTURES, name)


def all_fixtures():
    return ["%s-step%d.pickle" % (p, s) for p in PAIRS for s in (60, 180)]


class Payload:
    """Unpickles as `func(*args)`: what a hostile file does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def touch_command(path):
    return "%s -c %s" % (sys.executable, repr("open(%r, 'w').close()" % str(path)))


def hostile(tmp_path):
    """Payloads that would create a file in tmp_path if anything ran them."""
    import builtins

    out = []
    for i, proto in enumerate((0, 2, 4, 5)):  # GLOBAL (text) and STACK_GLOBAL (binary) forms
        out.append(("os.system/%d" % proto, "system", tmp_path / ("system%d" % i),
                    lambda p, proto=proto: pickle.dumps(Payload(os.system, touch_command(p)), protocol=proto)))
    out.append(("builtins.eval", "builtins.eval", tmp_path / "eval",
                lambda p: pickle.dumps(Payload(builtins.eval, "open(%r, 'w').close()" % str(p)))))
    out.append(("subprocess.call", "subprocess.call", tmp_path / "subprocess",
                lambda p: pickle.dumps(Payload(subprocess.call, [sys.executable, "-c", "open(%r, 'w').close()" % str(p)]))))
    # Hidden deep inside an otherwise good-looking snapshot.
    out.append(("nested", "system", tmp_path / "nested",
                lambda p: pickle.dumps({"segments": [{"blocks": [{"state": "active_allocated", "size": 1,
                                                                   "frames": [Payload(os.system, touch_command(p))]}]}]})))
    return out


def test_the_fixtures_are_plain_data_and_load():
    for name in all_fixtures():
        with open(fixture(name), "rb") as f:
            data = f.read()
        ops = {op.name for op, _, _ in pickletools.genops(data)}
        assert not ops & CALLING_OPCODES, name
        snap = load(fixture(name))
        assert isinstance(snap, dict) and snap["segments"] and snap == pickle.loads(data)


@pytest.mark.parametrize("case", range(7))
def test_a_pickle_that_calls_anything_is_refused_and_nothing_runs(tmp_path, case):
    label, names, target, make = hostile(tmp_path)[case]
    # The payload is live: the ordinary unpickler runs it (so this test can fail).
    proof = tmp_path / ("proof-" + target.name)
    pickle.loads(make(proof))
    assert proof.exists(), label
    path = tmp_path / "hostile.pickle"
    path.write_bytes(make(target))
    with pytest.raises(SnapshotError) as err:
        load(str(path))
    msg = str(err.value)
    assert not target.exists(), label
    assert msg.startswith(str(path) + ": refused") and names in msg and "nothing was run" in msg
    assert "\n" not in msg


def test_persistent_ids_and_extension_codes_are_refused(tmp_path):
    class Persisting(pickle.Pickler):
        def persistent_id(self, obj):
            return "x" if obj == "secret" else None

    import io

    buf = io.BytesIO()
    Persisting(buf, protocol=2).dump({"segments": ["secret"]})
    with pytest.raises(SnapshotError, match="persistent id"):
        loads(buf.getvalue(), "persist.pickle")

    # An extension code names a global by number; the unpickler still resolves it by find_class.
    target = tmp_path / "ext"
    module = os.system.__module__  # "posix" on Linux
    copyreg.add_extension(module, "system", 0x7A11)
    try:
        data = pickle.dumps(Payload(os.system, touch_command(target)), protocol=2)
        assert "EXT2" in {op.name for op, _, _ in pickletools.genops(data)}
        with pytest.raises(SnapshotError, match="refused: the pickle asks for %s.system" % module):
            loads(data, "ext.pickle")
    finally:
        copyreg.remove_extension(module, "system", 0x7A11)
    assert not target.exists()


def test_unusable_inputs_name_the_file_and_why(tmp_path):
    with open(fixture("healthy-step60.pickle"), "rb") as f:
        good = f.read()
    cases = {
        "truncated.pickle": (good[: len(good) // 2], "truncated"),
        "text.pickle": (b"segments: []\n", "not a pickle"),
        "empty.pickle": (b"", "empty, not a snapshot"),
        "list.pickle": (pickle.dumps([1, 2]), "not a torch.cuda.memory snapshot: a dict expected, found list"),
        "dict.pickle": (pickle.dumps({"blocks": []}), "a dict with a 'segments' list expected, no 'segments'"),
        "badseg.pickle": (pickle.dumps({"segments": {"a": 1}}), "'segments' is a dict"),
        "badblock.pickle": (pickle.dumps({"segments": [{"blocks": [{"state": "active_allocated"}]}]}),
                            "segment 0 block 0: 'size' is missing or not a byte count"),
        "badstate.pickle": (pickle.dumps({"segments": [{"blocks": [{"size": 4}]}]}), "'state' is missing"),
    }
    for name, (data, why) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(SnapshotError) as err:
            load(str(path))
        msg = str(err.value)
        assert msg.startswith(str(path) + ": ") and why in msg, (name, msg)
        assert "\n" not in msg
    with pytest.raises(SnapshotError, match="nope.pickle: cannot read: No such file or directory"):
        load(str(tmp_path / "nope.pickle"))
    with pytest.raises(SnapshotError, match="cannot read: Is a directory"):
        load(str(tmp_path))


def test_the_budget_caps_what_is_kept_not_the_file(tmp_path):
    # What a reader keeps is capped, whatever the file's size: a long string the schema drops is
    # skipped as it streams by, the same string kept is refused past the budget.
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "pad": "x" * 300000}))
    assert load(str(path), budget=64 << 10, keep="diff") == {"segments": []}
    with pytest.raises(SnapshotError, match=r"big.pickle: what it needs kept exceeds the budget of 0.1 MiB at offset \d+ "
                                            r"of 300\d+ \(\d+% through\) \(raise it with --budget MIB\)"):
        load(str(path), budget=64 << 10)
    assert load(str(path), budget=1 << 20)["pad"] == "x" * 300000
    with pytest.raises(SnapshotError, match="exceeds the budget"):
        loads(pickle.dumps({"segments": [{"blocks": []}] * 1}) + b"", "b", budget=10)
    assert snapload.DEFAULT_BUDGET == 2 << 30


def run_diff(*args):
    return subprocess.run([sys.executable, "-m", "gpumon_client", "diff", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_the_command_exits_2_with_one_line_naming_the_file(tmp_path):
    good = fixture("healthy-step60.pickle")
    bad = tmp_path / "evil.pickle"
    target = tmp_path / "pwned"
    bad.write_bytes(pickle.dumps(Payload(os.system, touch_command(target))))
    trunc = tmp_path / "cut.pickle"
    with open(good, "rb") as f:
        trunc.write_bytes(f.read()[:1000])
    for before, after, why in (
        (good, str(bad), "refused: the pickle asks for"),
        (str(bad), good, "refused: the pickle asks for"),
        (good, str(trunc), "truncated"),
        (good, str(tmp_path / "missing.pickle"), "cannot read: No such file or directory"),
    ):
        proc = run_diff(before, after)
        named = after if before == good else before
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m gpumon_client diff: %s: " % named), lines
        assert why in lines[0]
    assert not target.exists()
