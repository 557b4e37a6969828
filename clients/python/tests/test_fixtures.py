"""The golden protocol fixtures are what the client emits, byte for byte, and cover the protocol."""

import glob
import importlib.util
import json
import os

from gpumon_client import protocol
from gpumon_client.messages import Categories

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "protocol"))


def _generator():
    spec = importlib.util.spec_from_file_location("gen_protocol_fixtures", os.path.join(HERE, "..", "scripts", "gen_protocol_fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def test_client_output_matches_the_fixtures():
    generated = _generator().generate()
    for name, content in generated.items():
        assert _read(name) == content, (
            "%s drifted from the client's output; if the change is intended (fields are only ever "
            "added), run clients/python/scripts/gen_protocol_fixtures.py and commit the result" % name
        )
    on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(FIXTURES, "client_*.jsonl"))}
    assert on_disk == set(generated), "a fixture file no generator writes"


def test_fixtures_cover_the_protocol():
    kinds, types, keys, split_keys = set(), set(), set(), set()
    for path in glob.glob(os.path.join(FIXTURES, "client_*.jsonl")):
        raw = open(path, "rb").read()
        assert raw.endswith(b"\n")
        msgs = [json.loads(line) for line in raw.splitlines()]
        assert all(len(line) + 1 <= protocol.MAX_LINE for line in raw.splitlines())
        assert msgs[0]["type"] == "hello" and msgs[0]["v"] == protocol.VERSION
        # Every session ends with bye, but one stopped by a signal: its last line says so.
        last = msgs[-1]
        assert last["type"] == "bye" or (last.get("ending") == "signal" and "stopped" in path)
        assert [m["type"] for m in msgs].count("hello") == 1
        types.update(m["type"] for m in msgs)
        kinds.update(m["kind"] for m in msgs if m["type"] == "event")
        for m in msgs:
            keys.update(m.get("stats", {}))
            split_keys.update(m.get("categories", {}))
    assert types == {"hello", "sample", "event", "attribution", "armed", "peak", "bye"}
    assert kinds == set(protocol.EVENT_KINDS)
    assert set(protocol.KNOWN_STATS_KEYS) <= keys
    # A sample's split with every field, the optional ones (fp32_bytes, partial) included.
    assert split_keys == Categories.__required_keys__ | Categories.__optional_keys__
