"""TORCH_TPU_DEBUG (one line per flush and compile, a summary at exit) and metrics_report()."""

import os
import re
import subprocess
import sys
import textwrap

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
