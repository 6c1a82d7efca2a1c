"""The Spyre interpreter walks the dataflow schedule (issue 21): tile step by
tile step, each core on its own rows (loads into LX, the ops on the tiles,
stores), a reduction of the split rows combined over the ring of cores; a region
whose ops are not row-local runs on whole views (and says why). The executed
schedule gives each core's pipeline time; the profiler's device event carries it.

Values are checked against CPU PyTorch (float32) or the independent df16
reference of test_spyre_numerics (16-bit), never against the executor itself.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu
from test_spyre_numerics import _inputs, matmul_ref, same, store

pytestmark = requires_tpu


def _schedules():
    from torch_tpu_eager import spyre

    return spyre.last_schedule()


def test_mlp_step_runs_tile_by_tile(spyre_target):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(256, 512, generator=g), torch.randn(512, 256, generator=g) / 20, torch.randn(256, generator=g)
    y = F.gelu(x.to("tpu") @ w.to("tpu") + b.to("tpu"))
    z = F.layer_norm(y, (256,))
    out = torch.softmax(z * 2 + y, dim=-1)
    got = out.cpu()
    want = torch.softmax(F.layer_norm(F.gelu(x @ w + b), (256,)) * 2 + F.gelu(x @ w + b), dim=-1)
    assert torch.equal(got, want)
    for s in _schedules():
        assert s["executed"] == "tiles", (s["kernel"], s["whole_reason"])
        # Tile step i holds tile i of every core: ceil(rows_per_core / tile_rows) steps.
        assert s["tile_steps"] == math.ceil(s["rows_per_core"] / s["tile_rows"])
        assert s["tile_steps"] >= 2  # loads overlap compute: more than one tile


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_tiles_keep_one_rounding_per_op(spyre_target, dtype):
    a = _inputs(dtype, seed=21, shape=(200, 256))
    w = _inputs(dtype, seed=22, shape=(256, 128))
    d = a.to("tpu") @ w.to("tpu")
    got = torch.tanh(d * 0.5).cpu()
    (s,) = _schedules()
    assert s["executed"] == "tiles" and s["tile_steps"] >= 2
    mm = store(matmul_ref(a, w), dtype)
    half = store(mm.float() * 0.5, dtype)
    assert same(got, store(torch.tanh(half.float()), dtype)) == 0


def test_uneven_rows_cover_every_row_once(spyre_target):
    # 70 rows on 32 cores: 3 rows per core on 24 cores, the last core 1 row.
    x = torch.randn(70, 96)
    got = (x.to("tpu") * 3.0 - 1.0).cpu()
    assert torch.equal(got, x * 3.0 - 1.0)
    (s,) = _schedules()
    assert s["executed"] == "tiles"
    rows = [c["rows"] for c in s["per_core"]]
    assert len(rows) == s["cores_used"] == 24 and sum(rows) == 70 and rows[-1] == 1


def test_not_row_local_runs_whole_and_says_why(spyre_target):
    from torch_tpu_eager import metrics_report

    x = torch.randn(64, 32)
    got = torch.flip(x.to("tpu") * 2.0, [0]).cpu()
    assert torch.equal(got, torch.flip(x * 2.0, [0]))
    (s,) = _schedules()
    assert s["executed"] == "whole" and "flip" in s["whole_reason"]
    # Counted by the op that kept the region whole.
    assert any(line.strip().startswith("spyre_whole_region.flip:") for line in metrics_report().splitlines())
    # A square matmul: the right operand has the rows' size but is replicated.
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    got = (a.to("tpu") @ b.to("tpu")).cpu()
    assert torch.equal(got, a @ b)
    (s,) = _schedules()
    assert s["executed"] == "tiles", s["whole_reason"]


def test_executed_schedule_times_each_core(spyre_target):
    from torch_tpu_eager import metrics

    tte = spyre_target
    tte.reset_metrics()
    x, w = torch.randn(512, 1024), torch.randn(1024, 768)
    (x.to("tpu") @ w.to("tpu")).cpu()
    (s,) = _schedules()
    cores = s["per_core"]
    assert len(cores) == s["cores_used"] == 32
    assert s["executed_s"] == max(c["end_s"] for c in cores)
    for c in cores:
        busy = c["load_s"] + c["compute_s"] + c["store_s"]
        assert c["end_s"] <= busy + 1e-15 and c["overlap_s"] >= 0
        assert c["end_s"] >= max(c["compute_s"], c["load_s"] + c["store_s"]) - 1e-15
    # The model spreads C and M over n_tiles = 13 tiles; the walk's tiles are
    # whole rows: 8 tiles of 2 of the core's 16 rows. Close, not equal.
    assert (s["n_tiles"], s["tile_rows"], s["tile_steps"]) == (13, 2, 8)
    assert s["executed_s"] == pytest.approx(s["pipelined_s"], rel=0.02)
    m = metrics()
    assert m["schedule_time_s"] == pytest.approx(s["executed_s"], rel=1e-9)
    assert m["sim_time_s"] == pytest.approx(s["calibrated_s"], rel=1e-9)


def test_full_shares_equal_the_one_core_model(spyre_target):
    x, w = torch.randn(256, 512).half(), torch.randn(512, 256).half()
    (x.to("tpu") @ w.to("tpu")).cpu()
    (s,) = _schedules()
    assert s["tile_steps"] == s["n_tiles"] == 2 and len(s["per_core"]) == 32
    assert s["executed_s"] == pytest.approx(s["pipelined_s"], rel=1e-9)


def test_few_rows_make_the_executed_time_exceed_the_law(spyre_target):
    # 4 rows use 4 of 32 cores: each core does 8x the work the law spreads over all.
    x = torch.randn(4, 4096)
    torch.exp(x.to("tpu")).cpu()
    (s,) = _schedules()
    assert s["cores_used"] == 4
    assert s["executed_s"] > s["calibrated_s"]
    assert sum(c["compute_s"] for c in s["per_core"]) == pytest.approx(32 * s["compute_s"], rel=1e-9)


def test_profiler_event_carries_the_schedule_time(spyre_target, tmp_path):
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(128, 256).to("tpu")
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        torch.tanh(x * 2.0).cpu()
    (s,) = _schedules()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    (k,) = [e for e in events if e.get("cat") == "kernel"]
    assert k["args"]["sim_time_us"] == pytest.approx(s["calibrated_s"] * 1e6, rel=1e-6)
    assert k["args"]["schedule_time_us"] == pytest.approx(s["executed_s"] * 1e6, rel=1e-6)
    assert k["args"]["core_busy_us"] == pytest.approx([c["end_s"] * 1e6 for c in s["per_core"]], rel=1e-5)


def test_run_ktir_walks_the_cores_and_the_ring(spyre_target, tmp_path, monkeypatch):
    from torch_tpu_eager import spyre

    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    a = _inputs(torch.float16, seed=23, shape=(64, 128))
    d = a.to("tpu")
    got = d.sum(dim=0).cpu()
    (path,) = [p for p in tmp_path.iterdir() if p.suffix == ".ktir"]
    (out,) = spyre.run_ktir(str(path), a)
    assert torch.equal(out.view(got.shape), got)


def test_copy_into_a_tensor_walks_tiles(spyre_target):
    x = torch.randn(64, 48)
    d = torch.zeros(64, 48, device="tpu")
    d.copy_(x.to("tpu") * 2.0)
    got = d.cpu()
    assert torch.equal(got, x * 2.0)
    s = _schedules()[-1]
    assert s["executed"] == "tiles", s["whole_reason"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_gathers_walk_tiles_with_per_tile_index_loads(spyre_target, dtype):
    # The index rows are split (each tile loads its indices), the table is
    # read whole: index_select, x[idx], embedding, gather along dim 0.
    x = _inputs(dtype, seed=24, shape=(1000, 300))
    g = torch.Generator().manual_seed(25)
    idx, short = torch.randint(0, 1000, (1000,), generator=g), torch.randint(0, 1000, (700,), generator=g)
    cases = [
        (lambda t, i: t.index_select(0, i) * 2.0, idx),
        (lambda t, i: t[i] * 2.0, idx),
        (lambda t, i: t[i] + 1.0, short),
        (lambda t, i: F.embedding(i, t), short),
        (lambda t, i: torch.gather(t, 0, i.view(-1, 1).expand(-1, 300).contiguous()), idx),
    ]
    for f, i in cases:
        got = f(x.to("tpu"), i.to("tpu")).cpu()
        assert got.dtype == dtype
        # One rounding per op: the gather moves df16 values, the arithmetic rounds once.
        want = f(x, i) if dtype == torch.float32 else store(f(x.float(), i), dtype)
        assert same(got, want) == 0
        for s in _schedules():
            assert s["executed"] == "tiles", s["whole_reason"]


def test_nll_loss_backward_walks_tiles(spyre_target):
    g = torch.Generator().manual_seed(26)
    logits, target = torch.randn(1000, 10, generator=g), torch.randint(0, 10, (1000,), generator=g)
    for reduction in ("mean", "sum", "none"):
        lt = logits.to("tpu").requires_grad_()
        loss = F.nll_loss(F.log_softmax(lt, 1), target.to("tpu"), reduction=reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        got = lt.grad.cpu()
        kernels = {s["kernel"]: s for s in _schedules()}
        (name,) = [k for k in kernels if "nll_loss_backward" in k]
        assert kernels[name]["executed"] == "tiles", kernels[name]["whole_reason"]
        lc = logits.clone().requires_grad_()
        want = F.nll_loss(F.log_softmax(lc, 1), target, reduction=reduction)
        (want.sum() if reduction == "none" else want).backward()
        torch.testing.assert_close(got, lc.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_nll_loss_none_walks_tiles(spyre_target, dtype):
    # reduction='none': one loss per row (row-local); its total_weight result
    # is 0 whatever the rows (CPU's kernel), written alike by every step.
    x = _inputs(dtype, seed=27, shape=(1000, 10))
    g = torch.Generator().manual_seed(28)
    target = torch.randint(0, 10, (1000,), generator=g)
    target[::9] = -100
    weight = _inputs(dtype, seed=29, shape=(10,), positive=True)
    for w in (None, weight):
        out, total = torch.ops.aten.nll_loss_forward(
            x.to("tpu"), target.to("tpu"), None if w is None else w.to("tpu"), 0, -100
        )
        out, total = out.cpu(), total.cpu()
        kernels = {s["kernel"]: s for s in _schedules()}
        (name,) = [k for k in kernels if "nll_loss_forward" in k]
        assert kernels[name]["executed"] == "tiles", kernels[name]["whole_reason"]
        want, want_total = torch.ops.aten.nll_loss_forward(x, target, w, 0, -100)
        assert want_total.item() == 0 and total.item() == 0
        if dtype == torch.float32:
            assert torch.equal(out, want)
        else:  # one rounding of the f32 product of the df16 inputs
            keep = target != -100
            ref = torch.zeros(1000)
            picked = x.float()[keep.nonzero()[:, 0], target[keep]]
            wt = torch.ones(10) if w is None else w.float()
            ref[keep] = -(picked * wt[target[keep]])
            assert same(out, store(ref, dtype)) == 0
