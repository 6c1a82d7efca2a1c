"""Simulated TPU targets: chip data, layouts (padding), cost model, HBM capacity, profiler.

Expected numbers are computed here from the chip data files and the published
rules (tiles of (8,128) 32-bit / (16,128) 16-bit / (32,128) 8-bit, MXU passes,
roofline), never taken from the device's own output.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from difftest import REPO_ROOT, requires_tpu

pytestmark = [requires_tpu, pytest.mark.usefixtures("restore_target_and_precision")]

TPU_TARGETS = ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"]


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _targets_dir():
    return os.path.join(os.path.dirname(_tte().__file__), "targets")


def chip(name):
    """The parameter values of a chip data file, read directly."""
    with open(os.path.join(_targets_dir(), name + ".json")) as f:
        return {k: p["value"] for k, p in json.load(f)["params"].items()}


def vpu_rate(c):
    # One element per (sublane, lane) slot per cycle per TensorCore, at the clock the bf16 peak implies.
    clock = c["peak_bf16_flops"] / (2 * c["mxus_per_core"] * c["tensor_cores"] * c["mxu_size"] ** 2)
    return c["tensor_cores"] * c["sublanes"] * c["lanes"] * clock


def tiled_bytes(shape, itemsize):
    """HBM bytes of a value under the TPU tiled layout (an independent reimplementation)."""
    if len(shape) == 0:
        return itemsize
    pack = max(1, 4 // itemsize)
    if len(shape) == 1:
        return math.ceil(shape[0] / (128 * pack)) * 128 * pack * itemsize
    rows, cols, sub = shape[-2], shape[-1], 8 * pack
    return math.prod(shape[:-2]) * math.ceil(rows / sub) * sub * math.ceil(cols / 128) * 128 * itemsize


def round_up(x, m):
    return -(-x // m) * m


def profiled(fn):
    """Runs fn() under the profiler after flushing earlier work; returns (prof, result)."""
    torch.tpu.synchronize()
    with _tte().profile() as prof:
        out = fn()
    return prof, out


def only_kernel(prof, *op_names):
    """The one kernel that ran an op named one of op_names (overload dropped)."""
    ks = [k for k in prof.kernels if any(o.split(".")[0] in op_names for o in k["ops"])]
    assert len(ks) == 1, [k["ops"] for k in prof.kernels]
    return ks[0]


# ---- chip data and set_target ----


def test_chip_files_give_every_number_a_source():
    names = sorted(f[:-5] for f in os.listdir(_targets_dir()) if f.endswith(".json"))
    assert set(TPU_TARGETS) <= set(names)
    for name in names:
        with open(os.path.join(_targets_dir(), name + ".json")) as f:
            spec = json.load(f)
        assert spec["name"] == name
        for key, p in spec["params"].items():
            assert isinstance(p["value"], (int, float)) and p["value"] > 0, (name, key)
            assert isinstance(p["source"], str) and len(p["source"]) > 10, (name, key)
            assert p["unit"], (name, key)


def test_chip_files_hold_the_published_facts():
    # Google Cloud TPU docs and jax/_src/tpu_info.py, as quoted in issue 5.
    v5e, v6e, v4, v5p = (chip(n) for n in ("tpu-v5e", "tpu-v6e", "tpu-v4", "tpu-v5p"))
    assert (v5e["peak_bf16_flops"], v5e["hbm_bandwidth"], v5e["mxus_per_core"], v5e["tensor_cores"]) == (
        197e12,
        819e9,
        4,
        1,
    )
    assert (v5e["hbm_bytes"], v5e["vmem_bytes"], v5e["mxu_size"]) == (16 * 2**30, 128 * 2**20, 128)
    assert (v6e["peak_bf16_flops"], v6e["hbm_bandwidth"], v6e["hbm_bytes"], v6e["mxu_size"]) == (
        918e12,
        1638e9,
        32 * 2**30,
        256,
    )
    assert (v4["peak_bf16_flops"], v4["vmem_bytes"], v4["mxu_size"]) == (275e12, 16 * 2**20, 128)
    assert (v5p["peak_bf16_flops"], v5p["mxu_size"]) == (459e12, 128)
    for c in (v5e, v6e, v4, v5p):
        assert (c["sublanes"], c["lanes"]) == (8, 128)


@pytest.mark.parametrize("name", TPU_TARGETS)
def test_set_target_round_trip(name):
    tte = _tte()
    tte.set_target(name)
    assert tte.get_target() == name
    info, c = tte.target_info(), chip(name)
    assert all(info[k] == v for k, v in c.items())
    assert info["vpu_elems_per_s"] == pytest.approx(vpu_rate(c), rel=1e-12)
    assert tte._C._memory_capacity(0) == c["hbm_bytes"]


def test_unknown_target_raises_value_error_listing_valid_ones():
    tte = _tte()
    before = tte.get_target()
    for bad in ("tpu-v9", "", None, "TPU-V5E"):
        with pytest.raises(ValueError) as e:
            tte.set_target(bad)
        assert all(n in str(e.value) for n in TPU_TARGETS), str(e.value)
    assert tte.get_target() == before


def test_env_var_selects_target_at_import():
    code = "import torch_tpu_eager as t; print(t.get_target())"
    env = dict(os.environ, TORCH_TPU_TARGET="tpu-v6e")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tpu-v6e"
    env["TORCH_TPU_TARGET"] = "tpu-v99"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "ValueError" in out.stderr and "tpu-v5e" in out.stderr, out.stderr


def test_switch_flushes_pending_work_costed_on_the_previous_chip():
    tte = _tte()
    tte.set_target("tpu-v5e")
    xc = torch.randn(64, 128)
    x = xc.to("tpu")
    torch.tpu.synchronize()
    tte.reset_metrics()
    y = x * 2 + 1  # one fused region: read x, write y
    assert tte._C._pending_ops() == 2
    tte.set_target("tpu-v6e")
    assert tte._C._pending_ops() == 0 and tte._C._cache_size() == 0
    m = tte.metrics()
    assert m["flush_reasons"] == {"target_switch": 1}, m
    v5e = chip("tpu-v5e")
    memory = 2 * 64 * 128 * 4 / v5e["hbm_bandwidth"]
    compute = 2 * 64 * 128 / vpu_rate(v5e)
    assert m["sim_time_s"] == pytest.approx(max(memory, compute) + v5e["launch_s"], rel=1e-9)
    torch.testing.assert_close(y.cpu(), xc * 2 + 1)
    # Switching to the active target again is allowed and changes nothing.
    tte.set_target("tpu-v6e")
    assert tte.get_target() == "tpu-v6e"


# ---- layouts: padding bytes ----


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.int64])
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 5), (100,), (8, 128), (17, 130), (16, 256), (40, 1)])
def test_padding_bytes_follow_tiled_layout(dtype, shape):
    tte = _tte()
    xc = (torch.arange(math.prod(shape)) % 7).reshape(shape).to(dtype)
    x = xc.to("tpu")
    torch.tpu.synchronize()
    tte.reset_metrics()
    prof, y = profiled(lambda: x.clone())
    k = only_kernel(prof, "clone")
    item = xc.element_size()
    logical = math.prod(shape) * item
    assert (k["bytes_read"], k["bytes_written"]) == (logical, logical)
    assert k["padding_bytes"] == 2 * (tiled_bytes(shape, item) - logical)
    assert tte.metrics()["padding_bytes"] == k["padding_bytes"]
    assert torch.equal(y.cpu(), xc)


# ---- cost model ----


@pytest.mark.parametrize("name", TPU_TARGETS)
def test_large_bf16_matmul_is_costed_near_peak(name):
    tte = _tte()
    tte.set_target(name)
    n = 2048
    ac, bc = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
    a, b = ac.to("tpu"), bc.to("tpu")
    prof, c = profiled(lambda: a @ b)
    k = only_kernel(prof, "mm")
    ideal = 2 * n**3 / chip(name)["peak_bf16_flops"]
    assert ideal <= k["sim_time_s"] <= 1.3 * ideal, (k["sim_time_s"], ideal)
    assert k["flops"] == 2 * n**3
    assert (k["bytes_read"], k["bytes_written"], k["padding_bytes"]) == (2 * n * n * 2, n * n * 2, 0)
    torch.testing.assert_close(c.cpu().float(), (ac.float() @ bc.float()), rtol=2e-2, atol=1.0)


@pytest.mark.parametrize("name", TPU_TARGETS)
def test_large_elementwise_region_is_costed_near_hbm_bandwidth(name):
    tte = _tte()
    tte.set_target(name)
    n = 2048
    xc, yc = torch.randn(n, n), torch.randn(n, n)
    x, y = xc.to("tpu"), yc.to("tpu")
    prof, z = profiled(lambda: x + y)
    k = only_kernel(prof, "add")
    hbm = 3 * n * n * 4
    ideal = hbm / chip(name)["hbm_bandwidth"]
    assert (k["bytes_read"], k["bytes_written"], k["padding_bytes"]) == (2 * n * n * 4, n * n * 4, 0)
    assert ideal <= k["sim_time_s"] <= 1.3 * ideal, (k["sim_time_s"], ideal)
    torch.testing.assert_close(z.cpu(), xc + yc)


@pytest.mark.parametrize("precision,passes", [("highest", 6), ("high", 3), ("medium", 1)])
def test_f32_matmul_costs_bf16_passes_by_precision(precision, passes):
    tte = _tte()
    tte.set_target("tpu-v5e")
    torch.set_float32_matmul_precision(precision)
    n = 1024
    a, b = torch.randn(n, n).to("tpu"), torch.randn(n, n).to("tpu")
    prof, _ = profiled(lambda: a @ b)
    k = only_kernel(prof, "mm")
    assert k["mxu_flops"] == passes * 2 * n**3
    assert k["compute_s"] == pytest.approx(passes * 2 * n**3 / chip("tpu-v5e")["peak_bf16_flops"], rel=1e-12)


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e"])
def test_mxu_work_pads_to_the_chip_mxu(name):
    tte = _tte()
    tte.set_target(name)
    d = chip(name)["mxu_size"]
    peak = chip(name)["peak_bf16_flops"]
    m, kk, nn, batch = 100, 130, 60, 3
    a = torch.randn(batch, m, kk).bfloat16().to("tpu")
    b = torch.randn(batch, kk, nn).bfloat16().to("tpu")
    v = torch.randn(kk).bfloat16().to("tpu")
    prof, _ = profiled(lambda: (torch.bmm(a, b), a[0] @ v))
    k = only_kernel(prof, "bmm")
    assert k["flops"] == 2 * batch * m * kk * nn
    assert k["mxu_flops"] == 2 * batch * round_up(m, 8) * round_up(kk, d) * round_up(nn, d)
    assert k["compute_s"] == pytest.approx(k["mxu_flops"] / peak, rel=1e-12)
    k = only_kernel(prof, "mv", "addmv_")  # a vector is one column padded to a whole MXU tile
    assert k["mxu_flops"] == 2 * round_up(m, 8) * round_up(kk, d) * d


def test_long_elementwise_chain_is_vpu_bound():
    tte = _tte()
    tte.set_target("tpu-v5e")
    c = chip("tpu-v5e")
    n, steps = 1024, 40
    xc = torch.randn(n, n)
    x = xc.to("tpu")

    def chain(t):
        for i in range(steps // 2):
            t = t * 0.5 + 0.25
        return t

    prof, y = profiled(lambda: chain(x))
    assert len(prof.kernels) == 1, [k["ops"] for k in prof.kernels]
    k = prof.kernels[0]
    assert len(k["ops"]) == steps
    compute = steps * n * n / vpu_rate(c)
    memory = 2 * n * n * 4 / c["hbm_bandwidth"]
    assert compute > memory
    assert k["compute_s"] == pytest.approx(compute, rel=1e-9)
    assert k["sim_time_s"] == pytest.approx(compute + c["launch_s"], rel=1e-9)
    torch.testing.assert_close(y.cpu(), chain(xc))


def test_out_arguments_and_overwritten_selves_are_not_read():
    n = 256
    x, y = torch.randn(n, n).to("tpu"), torch.randn(n, n).to("tpu")
    z = torch.empty(n, n, device="tpu")
    prof, _ = profiled(lambda: torch.add(x, y, out=z))
    k = only_kernel(prof, "add")
    assert (k["bytes_read"], k["bytes_written"]) == (2 * n * n * 4, n * n * 4)
    prof, _ = profiled(lambda: x.fill_(2.0))
    k = only_kernel(prof, "fill_")
    assert (k["bytes_read"], k["bytes_written"]) == (0, n * n * 4)
    assert torch.equal(x.cpu(), torch.full((n, n), 2.0))


def test_two_views_of_one_storage_are_two_reads():
    n = 256
    x = torch.randn(n, 2 * n).to("tpu")
    prof, _ = profiled(lambda: x[:, :n] + x[:, n:])
    k = only_kernel(prof, "add")
    assert k["bytes_read"] == 2 * n * n * 4


# ---- HBM capacity ----


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e"])
def test_allocation_past_hbm_raises_out_of_memory_and_keeps_tensors(name):
    tte = _tte()
    tte.set_target(name)
    hbm = chip(name)["hbm_bytes"]
    keep_c = torch.randn(100, 100)
    keep = keep_c.to("tpu") * 2  # pending work survives the failed allocation
    before = torch.tpu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(hbm // 4 + 1, dtype=torch.float32, device="tpu")
    assert name in str(e.value) and "HBM" in str(e.value), str(e.value)
    assert torch.tpu.memory_allocated() == before
    torch.testing.assert_close(keep.cpu(), keep_c * 2)
    small = torch.ones(10, device="tpu")
    assert small.sum().item() == 10


# ---- profiler ----


def test_profiler_records_every_kernel_on_a_simulated_timeline():
    tte = _tte()
    tte.set_target("tpu-v5e")
    xc, wc = torch.randn(64, 256), torch.randn(256, 128)
    x, w = xc.to("tpu"), wc.to("tpu")
    torch.tpu.synchronize()
    tte.reset_metrics()
    prof, (h, s) = profiled(lambda: ((x * 2 + 1) @ w, (x * x).sum()))
    m = tte.metrics()
    keys = {"name", "ops", "shapes", "bytes_read", "bytes_written", "flops", "padding_bytes", "sim_time_s", "start_s"}
    assert len(prof.kernels) == m["regions_run"] >= 2
    for k in prof.kernels:
        assert keys <= set(k) and k["target"] == "tpu-v5e"
    assert prof.kernels[0]["start_s"] == 0
    for a, b in zip(prof.kernels, prof.kernels[1:]):
        assert b["start_s"] == pytest.approx(a["start_s"] + a["sim_time_s"], rel=1e-12)
    assert prof.total_sim_time_s == pytest.approx(m["sim_time_s"], rel=1e-12)
    ops = [o for k in prof.kernels for o in k["ops"]]
    assert "mm" in ops and "sum.dim_IntList" in ops and "mul.Tensor" in ops
    mm = only_kernel(prof, "mm")
    assert [[64, 256], [256, 128]] in mm["shapes"] and mm["flops"] == 2 * 64 * 256 * 128
    torch.testing.assert_close(h.cpu(), (xc * 2 + 1) @ wc)
    torch.testing.assert_close(s.cpu(), (xc * xc).sum())


def test_profiler_table_and_chrome_trace(tmp_path):
    n = 512
    a, b = torch.randn(n, n).bfloat16().to("tpu"), torch.randn(n, n).bfloat16().to("tpu")
    x = torch.randn(8, 8).to("tpu")
    prof, _ = profiled(lambda: (a @ b, (x + 1).relu()))
    text = prof.table(file=None)
    lines = text.splitlines()
    slow = max(prof.kernels, key=lambda k: k["sim_time_s"])
    fast = min(prof.kernels, key=lambda k: k["sim_time_s"])
    assert slow["name"] != fast["name"]
    assert text.index(slow["name"]) < text.index(fast["name"])  # sorted by time, largest first
    assert lines[0].startswith("kernel") and f"{len(prof.kernels)} kernels" in lines[-1]
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(prof.kernels)
    for e, k in zip(events, prof.kernels):
        assert e["name"] == k["name"]
        assert e["ts"] == pytest.approx(k["start_s"] * 1e6) and e["dur"] == pytest.approx(k["sim_time_s"] * 1e6)
        assert e["args"]["ops"] == k["ops"]


def test_nothing_is_recorded_without_a_profiler():
    tte = _tte()
    x = torch.randn(32, 32).to("tpu")
    prof, _ = profiled(lambda: x + 1)
    n = len(prof.kernels)
    assert not tte._C._trace_active() and tte._C._trace_size() == 0
    (x * 3).sum().item()
    assert tte._C._trace_size() == 0 and len(prof.kernels) == n


def test_profilers_nest():
    tte = _tte()
    x = torch.randn(32, 32).to("tpu")
    torch.tpu.synchronize()
    with tte.profile() as outer:
        (x + 1).cpu()
        with tte.profile() as inner:
            (x * 2).cpu()
        (x - 1).cpu()
    assert [k["ops"] for k in inner.kernels] == [["mul.Tensor"]]
    assert [k["ops"] for k in outer.kernels] == [["add.Tensor"], ["mul.Tensor"], ["sub.Tensor"]]
    assert inner.kernels[0]["start_s"] == 0
    assert tte._C._trace_size() == 0


# ---- examples/roofline.py ----


def test_roofline_example_runs(tmp_path, capsys):
    import importlib.util

    path = os.path.join(REPO_ROOT, "examples", "roofline.py")
    spec = importlib.util.spec_from_file_location("roofline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tte = _tte()
    before = tte.get_target()
    png = tmp_path / "roofline.png"
    assert mod.main(["--quick", "--targets", "tpu-v6e", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert tte.get_target() == before
    assert "tpu-v6e: 918 TFLOP/s bf16" in out and "digits MLP training step" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("bf16", "f32"))]) == 9
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out and not png.exists()
    else:
        assert png.stat().st_size > 0
