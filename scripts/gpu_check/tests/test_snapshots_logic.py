"""The snapshot check's logic on CPU, without torch: the marks that give each case's expected line,
the generated trainers' syntax, and the verdicts, fed the shared real snapshots
(tests/fixtures/torch-snapshots) as if the GPU run had made them:
`python3 -m pytest -q scripts/gpu_check/tests/test_snapshots_logic.py`."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import report  # noqa: E402
import snapshots as sn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "torch-snapshots")
# What tests/fixtures/torch-snapshots/README.md says each pair shows (the top site first).
FIXTURE_EXPECTED = {"leak-kept-outputs": ("train.py", 27), "leak-eval-graph": ("train.py", 34), "healthy": None}


@pytest.fixture(scope="module")
def fixture_results():
    return {
        pair: sn.diff_pair(sys.executable, os.path.join(FIXTURES, pair + "-step60.pickle"), os.path.join(FIXTURES, pair + "-step180.pickle"))
        for pair in FIXTURE_EXPECTED
    }


def test_each_leak_case_has_one_mark_on_a_code_line():
    srcs = sn.sources()
    expected = sn.expected_sites(srcs)
    assert set(expected) == set(sn.CASES)
    assert [c for c in sn.HEALTHY if expected[c] is not None] == []
    assert expected["other_file_preds"][0] == sn.METRICS  # the other file
    for case in sn.LEAKS:
        name, line = expected[case]
        text = srcs[name].splitlines()[line - 1]
        assert "# MARK:%s" % case in text and text.split("#")[0].strip(), (case, text)
    # The marked lines are the allocations the cases are about.
    lines = {c: srcs[expected[c][0]].splitlines()[expected[c][1] - 1] for c in sn.LEAKS}
    assert "self.body(x)" in lines["module_cache"]
    assert "p.grad.clone()" in lines["grad_clones"]
    assert "torch.softmax" in lines["other_file_preds"]
    assert "model(val_x)" in lines["val_graph"]


def test_marks_that_are_missing_doubled_unknown_or_alone_are_errors():
    good = sn.sources()
    with pytest.raises(ValueError, match="no mark for grad_clones"):
        sn.expected_sites({k: v.replace("# MARK:grad_clones", "") for k, v in good.items()})
    with pytest.raises(ValueError, match="a second mark for 'val_graph'"):
        sn.expected_sites(dict(good, extra="x = 1  # MARK:val_graph\n"))
    with pytest.raises(ValueError, match="not a leak case"):
        sn.expected_sites(dict(good, extra="x = 1  # MARK:healthy_varying_batch\n"))
    with pytest.raises(ValueError, match="without code"):
        stripped = {k: v.replace("  # MARK:other_file_preds", "") for k, v in good.items()}
        sn.expected_sites(dict(stripped, extra="    # MARK:other_file_preds\n"))


def test_the_generated_trainers_compile():
    for name, text in sn.sources().items():
        compile(text, name, "exec")
    assert "_dump_snapshot" in sn.TRAINER_SRC and "_record_memory_history" in sn.TRAINER_SRC


def test_the_shared_fixtures_pass_as_if_they_were_the_runs(fixture_results):
    checks = [sn.evaluate_case(pair, fixture_results[pair], exp) for pair, exp in FIXTURE_EXPECTED.items()]
    assert [c.status for c in checks] == [report.PASS] * 3, [c.as_dict() for c in checks]
    assert checks[0].figure == "train.py:27 in kept_outputs, 120.0 MiB (+120 blocks) of 120.0 MiB"
    assert checks[1].figure.startswith("train.py:34 in eval_without_no_grad, 24.0 MiB (+96 blocks)")
    assert checks[1].detail == "train.py:47 in run, 24.0 MiB (+24 blocks)"
    assert checks[2].figure == "nothing attributed (live memory grew 0.0 MiB)"
    assert [fixture_results[p]["rc"] for p in FIXTURE_EXPECTED] == [1, 1, 0]


def test_mismatches_fail_and_say_what_was_expected(fixture_results):
    kept, healthy = fixture_results["leak-kept-outputs"], fixture_results["healthy"]
    wrong_line = sn.evaluate_case("x", kept, ("train.py", 28))
    assert wrong_line.status == report.FAIL and wrong_line.figure.startswith("expected train.py:28, got train.py:27")
    wrong_file = sn.evaluate_case("x", kept, ("metrics_snap.py", 27))
    assert wrong_file.status == report.FAIL
    # The second site of eval-graph is not its top site.
    assert sn.evaluate_case("x", fixture_results["leak-eval-graph"], ("train.py", 47)).status == report.FAIL
    leak_as_healthy = sn.evaluate_case("x", kept, None)
    assert leak_as_healthy.status == report.FAIL and "expected nothing, got train.py:27" in leak_as_healthy.figure
    healthy_as_leak = sn.evaluate_case("x", healthy, ("train.py", 27))
    assert healthy_as_leak.status == report.FAIL and "got no site" in healthy_as_leak.figure
    # The right site with the wrong exit status is a failure of the command.
    assert sn.evaluate_case("x", dict(kept, rc=0), ("train.py", 27)).status == report.FAIL
    assert sn.evaluate_case("x", dict(healthy, rc=1), None).status == report.FAIL


def test_errors_fail(tmp_path):
    assert sn.evaluate_case("x", {"error": "trainer exited 1: boom"}, None).status == report.FAIL
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    r = sn.diff_pair(sys.executable, str(bad), os.path.join(FIXTURES, "healthy-step60.pickle"))
    assert r["rc"] == 2 and r["json"] is None and "not a pickle" in r["stderr"]
    c = sn.evaluate_case("x", r, None)
    assert c.status == report.FAIL and "diff exited 2" in c.figure and "bad.pickle" in c.figure


def test_skip_and_preflight(tmp_path):
    checks = sn.run_all(sys.executable, str(tmp_path), skip="CPU self-test")
    assert [(c.name, c.status) for c in checks] == [("snapshot diff: %s" % c, report.SKIP) for c in sn.CASES]
    assert "did not run" in sn.preflight(str(tmp_path / "no-python"), False)
    assert sn.main(["--python", str(tmp_path / "no-python"), "--out", str(tmp_path)]) == 2
