"""TORCH_TPU_DEBUG (one line per flush and compile, a summary at exit) and metrics_report()."""

import inspect
import os
import re
import subprocess
import sys
import textwrap
import warnings

import torch

import torch_tpu_eager as tte

SCRIPT = textwrap.dedent("""
    import torch, torch_tpu_eager
    x = torch.randn(8, 8, device="tpu", requires_grad=True)
    for i in range(3):
        y = (x.sin() * 2).sum()
        y.backward()
        print(y.item())                      # line 7: the flush the report must name
    z = (x.detach() + 1).cpu()               # line 8
""")


def _run(tmp_path, level):
    path = tmp_path / "prog.py"
    path.write_text(SCRIPT)
    env = dict(os.environ, TORCH_TPU_DEBUG=str(level))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return str(path), proc.stderr


def test_level_1_names_each_flush_cause_and_the_users_line(tmp_path):
    path, err = _run(tmp_path, 1)
    flushes = [line for line in err.splitlines() if line.startswith("[tpu debug] flush:")]
    item = [f for f in flushes if f.startswith("[tpu debug] flush: item,")]
    assert len(item) == 3 and all(f.endswith(f"at {path}:7") for f in item), err
    assert any(f.startswith("[tpu debug] flush: host_read,") and f.endswith(f"at {path}:8") for f in flushes), err
    # The first step compiles its regions, the later ones hit the cache.
    assert re.search(r"flush: item, \d+ ops, \d+ regions, [1-9]\d* compiled, 0 cache hits", item[0])
    assert re.search(r"flush: item, \d+ ops, \d+ regions, 0 compiled, [1-9]\d* cache hits", item[2])
    assert "[tpu debug] compile: region" in err
    assert "[tpu] region" not in err  # regions are level 2


def test_level_1_summary_at_exit_counts_causes_and_top_lines(tmp_path):
    path, err = _run(tmp_path, 1)
    summary = err[err.index("[tpu debug] summary:") :].splitlines()
    assert re.match(r"\[tpu debug\] summary: 4 flushes \((host_read 1, item 3|item 3, host_read 1)\)", summary[0]), (
        summary
    )
    assert re.match(rf"\[tpu debug\]\s+3 flushes triggered at {re.escape(path)}:7$", summary[1]), summary


def test_level_2_adds_regions_and_level_0_prints_nothing(tmp_path):
    _, err2 = _run(tmp_path, 2)
    assert re.search(r"\[tpu\] region fused_\w+ \(\d+ ops, key [0-9a-f]{16}, cache hit\)", err2), err2
    _, err0 = _run(tmp_path, 0)
    assert "[tpu" not in err0


def test_metrics_report_has_counters_timers_and_fallback_ops():
    tte.reset_metrics()
    x = torch.randn(64, 64, device="tpu")
    for _ in range(5):
        (x @ x).relu().sum().item()
    report = tte.metrics_report()
    assert re.search(r"^  flushes: 5$", report, re.M) and re.search(r"^  flush_reasons\.item: 5$", report, re.M)
    m = re.search(r"^  flush: count 5, total ([\d.]+), p50 ([\d.]+), p90 ([\d.]+), p99 ([\d.]+)$", report, re.M)
    assert m, report
    total, p50, p90, p99 = map(float, m.groups())
    assert 0 < p50 <= p90 <= p99 <= total
    tte.reset_metrics()
    assert "flush: count" not in tte.metrics_report()


def test_cpu_fallback_ops_are_named_in_the_report():
    # An op with a CPU kernel only (defined here, so no future tpu kernel can hide it).
    code = textwrap.dedent("""
        import warnings, torch, torch_tpu_eager as tte
        warnings.simplefilter("ignore")
        lib = torch.library.Library("tpu_debug_test", "DEF")
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CPU")
        x = torch.randn(5, device="tpu")
        for _ in range(2):
            assert torch.equal(torch.ops.tpu_debug_test.twice(x).cpu(), x.cpu() * 2)
        print(tte.metrics_report())
    """)
    env = dict(os.environ, TORCH_TPU_CPU_FALLBACK="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^  cpu_fallback\.tpu_debug_test::twice: 2$", proc.stdout, re.M), proc.stdout


def test_level_1_counts_ops_by_how_the_tpu_ran_them():
    # A fused chain (mul -> add -> relu) and a matmul, which runs its CPU kernel.
    code = textwrap.dedent("""
        import torch, torch_tpu_eager as tte
        a, b = torch.randn(8, 8).to("tpu"), torch.randn(8, 8).to("tpu")
        ((a * 2 + b).relu()).cpu(); (a @ b).cpu()
        print(tte.metrics_report())
    """)
    env = dict(os.environ, TORCH_TPU_DEBUG="1", TORCH_TPU_TARGET="tpu-v5e")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^  fused\.mul\.Tensor: 1$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^  fused\.relu: 1$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^  op_by_op\.mm: 1$", proc.stdout, re.M), proc.stdout


# ---- recompile warnings (RecompileWarning, once per line at the 8th compile) ----


def _recompile_warnings(caught):
    return [w for w in caught if issubclass(w.category, tte.RecompileWarning)]


def test_recompile_warning_when_an_argument_changes_says_mark_dynamic_cannot_help():
    # torch.arange(n)'s end is an argument of the region, part of its key: each new n compiles.
    w = torch.randn(61, 5, dtype=torch.float64)
    wd = w.to("tpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 30):
            line = inspect.currentframe().f_lineno + 1
            got = wd.index_select(0, torch.arange(n, device="tpu")).sum(0).cpu()
            torch.testing.assert_close(got, w.index_select(0, torch.arange(n)).sum(0), rtol=0, atol=1e-12)
            if n == tte_threshold() - 1:
                assert _recompile_warnings(caught) == []  # not before the 8th compile
    rec = _recompile_warnings(caught)
    assert len(rec) == 1, [str(r.message) for r in rec]  # once per line
    assert issubclass(tte.RecompileWarning, UserWarning)
    assert rec[0].filename == __file__ and rec[0].lineno == line
    msg = str(rec[0].message)
    assert f"{__file__}:{line}" in msg and "compiled for 8 different values of its size or index arguments" in msg
    assert "mark_dynamic" in msg and "would not help" in msg


def test_recompile_warning_for_ops_torch_records_names_the_users_line():
    # F.normalize is Python code in torch: its ops' innermost frames are torch's lines.
    # The warning names the user's line that called it (the innermost frame outside
    # torch, torch_tpu_eager and the standard library).
    import torch.nn.functional as F

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(11):
            x = torch.randn(1 << k, 3)
            line = inspect.currentframe().f_lineno + 1
            got = F.normalize(x.to("tpu"), dim=1).cpu()
            torch.testing.assert_close(got, F.normalize(x, dim=1))
    rec = _recompile_warnings(caught)
    assert len(rec) == 1, [str(r.message) for r in rec]
    assert rec[0].filename == __file__ and rec[0].lineno == line, (rec[0].filename, rec[0].lineno)
    assert f"{__file__}:{line}" in str(rec[0].message)


def tte_threshold():
    return 8  # debug::kRecompileWarnThreshold, documented in RecompileWarning


def _sin_sum_loop(mark, sizes):
    """(ms) for sizes: the values of a loop whose input size changes every step."""
    out = []
    for k in sizes:
        x = torch.arange(k * 3, dtype=torch.float32).reshape(k, 3)
        xd = x.to("tpu")
        if mark:
            tte.mark_dynamic(xd, 0, 1, 1 << 12)
        got = (xd.cos() * 3).sum().cpu()
        torch.testing.assert_close(got, (x.cos() * 3).sum())
        out.append(got)
    return out


def test_recompile_warning_for_new_input_sizes_suggests_mark_dynamic_and_it_helps():
    sizes = [1 << k for k in range(11)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _sin_sum_loop(False, sizes)
    rec = _recompile_warnings(caught)
    assert len(rec) == 1, [str(r.message) for r in rec]
    msg = str(rec[0].message)
    assert (
        "8 different sizes of one dim of its inputs" in msg
        and "torch_tpu_eager.mark_dynamic(tensor, dim, lower, upper)" in msg
    )
    assert rec[0].filename == __file__
    # The advice holds: with the dim marked, the loop compiles its region once, and does not warn.
    tte.reset_metrics()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _sin_sum_loop(True, [k + 5 for k in sizes])
    assert _recompile_warnings(caught) == []
    assert tte.metrics()["compiles"] <= 2  # the marked region, once (plus at most a host copy region)


def test_recompile_warning_is_filterable_and_an_error_filter_does_not_break_the_loop(monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=tte.RecompileWarning)
        for n in range(2, 14):
            torch.testing.assert_close(torch.arange(n, device="tpu").mul(7).cpu(), torch.arange(n).mul(7))
    assert _recompile_warnings(caught) == []
    # "error": raised inside a flush, it goes to sys.unraisablehook; the values stay right.
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tte.RecompileWarning)
        for n in range(2, 14):
            torch.testing.assert_close(torch.arange(n, device="tpu").add(5).cpu(), torch.arange(n).add(5))
    assert seen == [tte.RecompileWarning]


def test_metrics_report_times_record_and_region_run():
    tte.reset_metrics()
    x = torch.randn(32, device="tpu")
    xc = x.cpu()
    y = x
    for _ in range(200):  # 200 recorded ops: at least 3 are timed (1 in 64; every op at TORCH_TPU_DEBUG>=1)
        y = y * 0.5 + 0.25
    torch.testing.assert_close(y.cpu(), _affine(xc, 200))
    timers = {name: count for name, (count, _, _) in tte._C._timers().items()}
    assert timers["record"] >= 3
    assert timers["region_run"] == tte.metrics()["regions_run"] > 0
    report = tte.metrics_report()
    for name in ("record", "region_run", "flush"):
        assert re.search(rf"^  {name}: count \d+, total [\d.]+, p50 [\d.]+, p90 [\d.]+, p99 [\d.]+$", report, re.M)


def _affine(x, n):
    for _ in range(n):
        x = x * 0.5 + 0.25
    return x
