"""The coverage report CLI (``python -m torch_tpu_eager.coverage``) on three small OpInfos.

Runs the CLI into temporary files and checks that the Markdown report, the JSON and the
dispatcher agree: registration counts, per-case totals, per-op rows and the lowering
label of each OpInfo. No timing is asserted.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("expecttest", reason="torch.testing._internal (the OpInfo database) needs `pip install expecttest`")

from difftest import REPO_ROOT, requires_tpu  # noqa: E402

pytestmark = requires_tpu

OPS = ("add", "mul", "sum")
DTYPES = ("float32", "int64")
ROOT = REPO_ROOT


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "torch_tpu_eager.coverage", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coverage")
    md, js = tmp / "coverage.md", tmp / "coverage.json"
    proc = _cli(
        "--ops",
        ",".join(OPS),
        "--dtypes",
        ",".join(DTYPES),
        "--noncontiguous",
        "--out",
        str(md),
        "--json",
        str(js),
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return md.read_text(), json.loads(js.read_text()), proc.stderr


def _dispatcher_overloads():
    import torch_tpu_eager  # noqa: F401  (registers the kernels being counted)

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return {
        n[len("aten::") :]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::") and has(n, "PrivateUse1")
    }


def _md_int(md, pattern):
    m = re.search(pattern, md)
    assert m, f"pattern {pattern!r} not in the report"
    return tuple(int(g) for g in m.groups())


def test_registration_counts_match_dispatcher(report):
    md, data, _ = report
    reg = data["registration"]
    overloads = _dispatcher_overloads()
    names = {o.split(".", 1)[0] for o in overloads}
    assert reg["overloads"] == len(overloads)
    assert set(reg["overload_kinds"]) == overloads
    assert reg["names"] == len(names)
    assert _md_int(md, r"\*\*Registered ATen overloads\*\*: (\d+) \((\d+) distinct op names\)") == (
        len(overloads),
        len(names),
    )
    assert sum(reg["by_kind"].values()) == reg["overloads"]


def test_lowered_counts_follow_op_table(report):
    import torch_tpu_eager

    md, data, _ = report
    reg = data["registration"]
    table = dict(torch_tpu_eager.op_table())
    lowered_kinds = {"elementwise", "reduction", "matmul", "data", "random"}
    # Every registered overload that is an op-table row carries that row's kind.
    for o, kind in reg["overload_kinds"].items():
        assert kind == table.get(o, "runtime"), o
    lowered = {o for o, k in reg["overload_kinds"].items() if k in lowered_kinds}
    assert reg["lowered_overloads"] == len(lowered)
    assert reg["lowered_names"] == len({o.split(".", 1)[0] for o in lowered})
    assert _md_int(md, r"\*\*Lowered to primitive IR\*\*: (\d+) overloads \((\d+) names\)") == (
        reg["lowered_overloads"],
        reg["lowered_names"],
    )
    assert _md_int(md, r"\*\*Not lowered\*\*: (\d+) overloads") == (reg["overloads"] - reg["lowered_overloads"],)
    assert "674" in md and "483" in md  # the TorchTPU comparison


def test_results_cover_requested_cases(report):
    _, data, _ = report
    cases = {(r["op"], r["dtype"], r["noncontiguous"]) for r in data["results"]}
    assert cases == {(op, dt, nc) for op in OPS for dt in DTYPES for nc in (False, True)}
    assert data["opinfos"]["covered"] == len(OPS) and not data["opinfos"]["uncovered"]
    for r in data["results"]:
        assert r["total"] == r["passed"] + r["failed"] + r["errors"]
        assert r["status"] in ("pass", "fail", "error", "skip")
        assert (r["status"] == "pass") == (r["total"] > 0 and r["failed"] == r["errors"] == 0)
        assert r["total"] > 0, r  # add, mul and sum have float32 and int64 samples


def test_lowering_label_matches_overloads_reached(report):
    from torch_tpu_eager.testing import coverage, load_op_db, op_key

    _, data, _ = report
    kinds = data["registration"]["overload_kinds"]
    by_name = {op_key(op): op for op in load_op_db() if op_key(op) in OPS}
    for r in data["results"]:
        cov = coverage(by_name[r["op"]])
        assert set(r["overloads"]) == set(cov.registered)
        compute = [o for o in cov.registered if kinds[o] not in ("view", "runtime")]
        lowered = [o for o in compute if kinds[o] in ("elementwise", "reduction", "matmul", "data", "random")]
        want = (
            "view"
            if not compute
            else "lowered"
            if len(lowered) == len(compute)
            else "library"
            if not lowered
            else f"mixed {len(lowered)}/{len(compute)}"
        )
        assert r["lowering"] == want, r["op"]


def test_totals_are_sums_of_rows(report):
    md, data, _ = report
    for case, t in data["totals"].items():
        dtype, _, nc = case.partition("-")
        rows = [r for r in data["results"] if r["dtype"] == dtype and r["noncontiguous"] == bool(nc)]
        assert t["ops"] == len(rows)
        assert t["samples_passed"] == sum(r["passed"] for r in rows)
        assert t["samples_run"] == sum(r["total"] for r in rows)
        assert t["samples_skipped"] == sum(r["skipped"] for r in rows)
        assert sum(t[s] for s in ("pass", "fail", "error", "skip")) == len(rows)
        assert t["pass_rate"] == pytest.approx(t["samples_passed"] / t["samples_run"])
        # The Markdown totals row shows the same numbers.
        row = re.search(
            rf"^\| {re.escape(case)} \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| "
            rf"(\d+) / (\d+) \| \*\*([\d.]+)%\*\* \| ([\d.]+)%",
            md,
            re.M,
        )
        assert row, case
        got = tuple(int(g) for g in row.groups()[:7])
        assert got == (t["ops"], t["pass"], t["fail"], t["error"], t["skip"], t["samples_passed"], t["samples_run"])
        assert float(row.group(8)) == pytest.approx(100 * t["pass_rate"], abs=0.005)
        assert float(row.group(9)) == pytest.approx(100 * t["pass"] / (t["ops"] - t["skip"]), abs=0.005)


def test_markdown_rows_match_json(report):
    md, data, _ = report
    rows = re.findall(r"^\| (\S+) \| (\S+) \| (pass|fail|error|skip) \| (\d+) / (\d+) \| (\d+) \| ([^|]+) \|", md, re.M)
    want = [
        (
            r["op"],
            r["dtype"] + ("-noncontig" if r["noncontiguous"] else ""),
            r["status"],
            str(r["passed"]),
            str(r["total"]),
            str(r["skipped"]),
            r["lowering"],
        )
        for r in data["results"]
    ]
    assert [tuple(x.strip() for x in row) for row in rows] == want


def test_sweep_counts_match_direct_sweep(report):
    """The CLI's counts are those of sweep_op on the same OpInfo (the sweep is seeded)."""
    from torch_tpu_eager.testing import load_op_db, sweep_op

    _, data, _ = report
    add = next(op for op in load_op_db() if op.name == "add")
    res = sweep_op(add, torch.float32, "tpu")
    row = next(r for r in data["results"] if r["op"] == "add" and r["dtype"] == "float32" and not r["noncontiguous"])
    assert (row["passed"], row["failed"], row["errors"], row["skipped"]) == (
        res.passed,
        res.failed,
        res.errors,
        res.skipped,
    )


def test_header_names_date_torch_and_target(report):
    import torch_tpu_eager

    md, data, _ = report
    assert torch.__version__ in md
    assert data["meta"]["torch"] == torch.__version__
    assert re.search(r"\*\*Date\*\*: \d{4}-\d{2}-\d{2}", md)
    assert data["meta"]["target"] == torch_tpu_eager.get_target()
    assert f"**Target**: {data['meta']['target']}" in md


def test_progress_goes_to_stderr(report):
    _, _, stderr = report
    assert f"{len(OPS)}/{len(OPS)} ops" in stderr


def test_unknown_opinfo_name_is_rejected(tmp_path):
    proc = _cli("--ops", "add,no_such_op", "--out", str(tmp_path / "c.md"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "no_such_op" in proc.stderr
    assert not (tmp_path / "c.md").exists()


def test_unbuilt_target_exits_with_a_message(tmp_path):
    import torch_tpu_eager

    if "spyre" in torch_tpu_eager.list_targets():
        pytest.skip("the spyre target is built; nothing to refuse")
    proc = _cli("--target", "spyre", "--ops", "add", "--out", str(tmp_path / "c.md"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "spyre" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "c.md").exists()
