"""Smoke test of benchmarks/run_all.py: it completes and its checks against CPU pass.

No timing is asserted: figures depend on the machine and its load.
"""

import json
import os
import sys

import pytest
import torch

from difftest import REPO_ROOT, RUN_ALL_SMOKE_ARGS, requires_tpu

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

pytestmark = requires_tpu

# One correctness check per benchmark, named as its table row starts.
EXPECTED_CHECKS = (
    "record a + b",
    "record a.mul(b)",
    "flush, cache hit",
    "chain16",
    "softmax(dim=-1)",
    "layer_norm",
    "digits MLP step",
    "char-LM step",
)


@pytest.fixture(scope="module")
def run_all():
    import run_all as module

    return module


def test_quick_run_completes_and_checks_pass(run_all, tmp_path):
    import torch_tpu_eager

    limits = torch_tpu_eager.queue_limits()
    threads = torch.get_num_threads()
    out = tmp_path / "bench.json"
    assert run_all.main([*RUN_ALL_SMOKE_ARGS, "--json", str(out)]) == 0
    result = json.loads(out.read_text())

    failed = {k: v for k, v in result["checks"].items() if not v["passed"]}
    assert not failed, failed
    assert result["all_checks_passed"]
    # Every benchmark must have run its check; an empty set of checks would pass vacuously.
    for prefix in EXPECTED_CHECKS:
        assert any(name.startswith(prefix) for name in result["checks"]), (prefix, sorted(result["checks"]))
    # Every row that has a check was timed, none reports a failed check.
    timed = {row["benchmark"] for row in result["rows"] if row["values"]}
    for prefix in EXPECTED_CHECKS:
        assert any(b.startswith(prefix) for b in timed), (prefix, sorted(timed))
    rows = {row["benchmark"]: row for row in result["rows"]}
    bytes_rows = [r for b, r in rows.items() if b.startswith("chain16") and b.endswith("bytes moved")]
    assert len(bytes_rows) == 1 and "tpu/floor" in bytes_rows[0]["ratios"], sorted(rows)
    assert any(b.startswith("  compiles after") and r["notes"].get("tpu") for b, r in rows.items()), sorted(rows)
    # The record benchmark raises the queue limit only while it runs.
    assert torch_tpu_eager.queue_limits() == limits
    # So is the thread count it benchmarks with (one here; the caller's own may differ).
    assert torch.get_num_threads() == threads


def test_failed_check_is_reported(run_all):
    # The checks above must be able to fail: a wrong result is recorded, not swallowed.
    report = run_all.Report()
    ok = report.check("wrong", lambda: torch.testing.assert_close(torch.ones(2), torch.zeros(2)))
    assert ok is False
    assert report.checks["wrong"]["passed"] is False
    assert report.checks["wrong"]["error"]  # the first line of assert_close's message


def test_interleave_collects_only_what_its_rounds_made():
    """The collection before each timed call walks the rounds' own objects, not every object alive
    before them (torch's modules: after a full collection of those each repeat timed its first
    steps slow), still frees the rounds' garbage cycles, and leaves the collector as it was."""
    import gc
    import weakref

    from _timing import interleave

    class Cycle:
        pass

    seen, made = [], []

    def contender():
        seen.append((gc.get_freeze_count(), gc.isenabled()))
        c = Cycle()
        c.me = c  # garbage once this returns: only a collection frees it
        made.append(weakref.ref(c))
        return 0.0

    frozen_before = gc.get_freeze_count()
    samples = interleave({"a": contender, "b": contender}, repeats=3)
    assert [len(v) for v in samples.values()] == [3, 3]
    assert all(frozen > frozen_before and not enabled for frozen, enabled in seen), seen
    assert all(ref() is None for ref in made[:-1])  # each call's cycle freed before the next call
    assert gc.get_freeze_count() == frozen_before and gc.isenabled()
