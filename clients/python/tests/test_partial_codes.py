"""The memory split's `partial` codes are a string contract with the daemon, which maps them to
remedies: the client's codes are the shared table's (tests/fixtures/partial_split_codes.json at the
repository root, which the daemon's own test reads too), so renaming one here fails this test."""

import glob
import json
import os

from gpumon_client import categories

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TABLE = os.path.join(REPO, "tests", "fixtures", "partial_split_codes.json")


def table():
    with open(TABLE, encoding="utf-8") as f:
        return json.load(f)["codes"]


def test_the_clients_codes_are_the_tables():
    ours = {name: getattr(categories, name) for name in dir(categories) if name.startswith("PARTIAL_")}
    assert ours == {e["python"]: e["code"] for e in table()}


def test_the_table_is_well_formed():
    rows = table()
    codes = [e["code"] for e in rows]
    assert len(codes) == len(set(codes)) >= 7
    for e in rows:
        assert set(e) == {"code", "python", "sharded", "activations_unknown"}, e
        # A code is what the daemon splits off at the first ':' and trims.
        assert e["code"] == e["code"].strip() and ":" not in e["code"] and e["code"], e
        assert isinstance(e["sharded"], bool) and isinstance(e["activations_unknown"], bool), e


def test_the_reasons_the_client_sends_start_with_a_code_of_the_table():
    # The golden protocol fixtures are the client's exact output: their splits' reasons too.
    codes = {e["code"] for e in table()}
    seen = 0
    for path in glob.glob(os.path.join(REPO, "tests", "fixtures", "protocol", "client_*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                msg = json.loads(line)
                for reason in (msg.get("categories") or {}).get("partial") or []:
                    seen += 1
                    assert reason.split(":", 1)[0].strip() in codes, (os.path.basename(path), reason)
    assert seen >= 1  # client_categories.jsonl carries a Megatron split's main_grad reason


def test_the_readme_names_every_code():
    with open(os.path.join(REPO, "clients", "python", "README.md"), encoding="utf-8") as f:
        readme = f.read()
    missing = [e["code"] for e in table() if "- `%s`:" % e["code"] not in readme]
    assert missing == [], "README's *Where sums lie* does not list %s" % missing
