"""Two-operand losses and trace on the Spyre ring (issue 21): mse_loss,
huber_loss, smooth_l1_loss and binary_cross_entropy with reduction 'mean' or
'sum' sum their elementwise loss over the split rows of self and target (both
split with the rows), trace sums the diagonal element of each row; with
reduction 'none' a loss is elementwise and walks the tile steps
(docs/ktir.md, "Other ring ops").

The reference is independent of the executor: the inputs as they sit on the
device (df16 values), the elementwise loss of CPU's float32 op with reduction
'none' (the diagonal: written here), summed in the order docs/ktir.md
defines (each corelet's rows of each core's tile with CPU's float32 sum,
corelet 0 then 1, tiles in order, cores in order: test_spyre_ring's
_ordered_total), divided by the element count for 'mean', rounded once with
the df16 codec of test_spyre_numerics. 16-bit results equal it with 0
mismatches, float32 ones bit for bit; each is also close to CPU's op.
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu
from test_spyre_numerics import _inputs, same, store
from test_spyre_ring import _close, _ordered_total

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["f16", "bf16", "f32"]
SHAPES = [(64, 300), (1000, 300), (37, 2000), (2000, 300)]
SHAPE_IDS = ["64x300", "1000x300", "37x2000", "2000x300"]

LOSSES = {
    "mse": lambda x, y, r: F.mse_loss(x, y, reduction=r),
    "huber": lambda x, y, r: F.huber_loss(x, y, reduction=r, delta=0.7),
    "smooth_l1": lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
    "smooth_l1_beta0": lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.0),
    "bce": lambda x, y, r: F.binary_cross_entropy(x, y, reduction=r),
}


def _operands(name, dtype, shape, special=False):
    if name == "bce":
        x = _inputs(dtype, seed=50, shape=shape).float().sigmoid()
        y = _inputs(dtype, seed=51, shape=shape).float().sigmoid()
        if special:
            x[::7, ::3] = 0.0
            x[3::11, 1::5] = 1.0
        x, y = x.to(dtype), y.to(dtype)
        # df16 values of the dtype (the host->device copy rounds once)
        return store(x.float(), dtype), store(y.float(), dtype)
    x = _inputs(dtype, seed=52, shape=shape)
    y = _inputs(dtype, seed=53, shape=shape)
    if special:
        x[::13, ::7] = float("nan")
        x[5::17, 2::9] = float("inf")
        y[7::19, 4::11] = -float("inf")
        x[9::23] = y[9::23]  # zero differences
        if dtype != torch.float32:  # as the device holds them: df16 has no inf (NaN)
            x, y = store(x.float(), dtype), store(y.float(), dtype)
    return x, y


def _last_schedule():
    from torch_tpu_eager import spyre

    s = spyre.last_schedule()[-1]
    assert s["executed"] == "tiles", s["whole_reason"]
    return s


def _ring_sum(v32, sched):
    """f32 sums of v32 [rows, ...] in the ring's order."""
    return _ordered_total(v32, sched, lambda lo, hi: v32[lo:hi].sum(), lambda a, b: a + b)


def _check(got, ref32, dtype):
    want = ref32 if dtype == torch.float32 else store(ref32, dtype)
    assert got.dtype == dtype and got.shape == want.shape
    assert same(got, want) == 0, (got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_pair_loss_mean_sum_none_on_the_ring(spyre_target, name, dtype, shape):
    from torch_tpu_eager import metrics, metrics_report, reset_metrics

    f = LOSSES[name]
    for special in (False, True):
        x, y = _operands(name, dtype, shape, special)
        elementwise = f(x.float(), y.float(), "none")  # CPU's f32 kernel on the df16 values
        if name == "smooth_l1_beta0":
            # beta=0 is l1_loss, which PyTorch records as sub, abs, mean/sum: one
            # df16 rounding per op, so the difference is rounded before abs.
            d = x.float() - y.float()
            elementwise = (d if dtype == torch.float32 else store(d, dtype).float()).abs()
        for reduction in ("mean", "sum", "none"):
            reset_metrics()
            got = f(x.to("tpu"), y.to("tpu"), reduction).cpu()
            s = _last_schedule()
            if reduction == "none":
                _check(got, elementwise, dtype)
            else:
                total = _ring_sum(elementwise, s)
                ref = total / float(x.numel()) if reduction == "mean" else total
                assert s["ring_steps_run"] == s["cores_used"] - 1
                _check(got, ref, dtype)
                if not special:
                    _close(got, f(x.float(), y.float(), reduction).to(dtype), dtype)  # overflows as CPU's
            assert metrics()["library_calls"] == 0, (name, reduction)
            assert "spyre_library_call." not in metrics_report(), (name, reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_pair_loss_large_rows_over_several_tiles(spyre_target, dtype):
    # 1200x2000: each core's rows take several tile steps.
    x, y = _operands("mse", dtype, (1200, 2000))
    got = F.mse_loss(x.to("tpu"), y.to("tpu")).cpu()
    s = _last_schedule()
    assert s["tile_steps"] > 1
    _check(got, _ring_sum((x.float() - y.float()) ** 2, s) / float(x.numel()), dtype)


def test_bce_input_outside_0_1_raises_cpu_runtime_error(spyre_target):
    x = torch.rand(300, 20)
    x[150, 3] = 1.5
    y = torch.rand(300, 20)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(x, y)
    other = torch.arange(4.0, device="tpu") * 2
    loss = F.binary_cross_entropy(x.to("tpu"), y.to("tpu"))
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        loss.item()
    assert other.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_loss_shape_mismatch_raises_cpu_error_at_the_call(spyre_target):
    x, y = torch.rand(300, 20), torch.rand(300, 21)
    for f in (F.mse_loss, F.huber_loss, F.smooth_l1_loss):
        with pytest.raises(RuntimeError):
            f(x, y)
        with pytest.raises(RuntimeError):
            f(x.to("tpu"), y.to("tpu"))
    with pytest.raises(ValueError):
        F.binary_cross_entropy(x, y)
    with pytest.raises(ValueError):
        F.binary_cross_entropy(x.to("tpu"), y.to("tpu"))


def _diag(x32):
    rows, cols = x32.shape
    d = torch.zeros(rows, 1, dtype=x32.dtype)
    n = min(rows, cols)
    d[:n, 0] = x32[torch.arange(n), torch.arange(n)]
    return d


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES + [(1200, 2000), (300, 300)], ids=SHAPE_IDS + ["1200x2000", "300x300"])
def test_trace_sums_the_diagonal_on_the_ring(spyre_target, dtype, shape):
    from torch_tpu_eager import metrics, reset_metrics

    x = _inputs(dtype, seed=60, shape=shape)
    for special in (False, True):
        if special:
            x = x.clone()
            x[3, 3] = float("inf")
            x[7, 7] = -0.0
        reset_metrics()
        got = torch.trace(x.to("tpu")).cpu()
        s = _last_schedule()
        assert s["ring_steps_run"] == s["cores_used"] - 1
        _check(got, _ring_sum(_diag(x.float()), s).reshape(()), dtype)
        if not special:
            _close(got, torch.trace(x.float()), dtype)
        assert metrics()["library_calls"] == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16], ids=["i32", "i64", "i16"])
def test_trace_of_integers_is_cpus_int64(spyre_target, dtype):
    x = torch.randint(-1000, 1000, (1000, 300), generator=torch.Generator().manual_seed(61)).to(dtype)
    got = torch.trace(x.to("tpu")).cpu()
    want = torch.trace(x)
    assert got.dtype == want.dtype and int(got) == int(want)
    _last_schedule()


def test_losses_round_trip_in_ktir(spyre_target):
    from torch_tpu_eager import spyre

    x, y = _operands("mse", torch.float16, (1000, 300))
    p, t = _operands("bce", torch.float16, (1000, 300))
    for name, run, op in [
        ("mse", lambda: F.mse_loss(x.to("tpu"), y.to("tpu")), "mse_loss("),
        ("huber", lambda: F.huber_loss(x.to("tpu"), y.to("tpu"), reduction="sum", delta=2.0), "huber_loss("),
        ("sl1", lambda: F.smooth_l1_loss(x.to("tpu"), y.to("tpu"), beta=0.3), "smooth_l1_loss("),
        ("bce", lambda: F.binary_cross_entropy(p.to("tpu"), t.to("tpu")), "binary_cross_entropy("),
        ("trace", lambda: torch.trace(x.to("tpu")), "trace("),
    ]:
        run().cpu()
        text = spyre.dump_ktir().split("\n\n")[-1]
        text = text if text.endswith("\n") else text + "\n"
        assert "reduce=ring" in text and op in text, name
        assert spyre.format_ktir(text) == text, name
        spyre.verify_ktir(text)


BACKWARD = {
    "mse": lambda g, x, y, r: torch.ops.aten.mse_loss_backward(g, x, y, r),
    "huber": lambda g, x, y, r: torch.ops.aten.huber_loss_backward(g, x, y, r, 0.7),
    "smooth_l1": lambda g, x, y, r: torch.ops.aten.smooth_l1_loss_backward(g, x, y, r, 0.5),
    "bce": lambda g, x, y, r: torch.ops.aten.binary_cross_entropy_backward(g, x, y, None, r),
}
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_pair_loss_backward_rounds_once(spyre_target, name, dtype):
    # The gradient is one op: df16 of CPU's float32 kernel on the df16 values.
    # 'sum' and 'none' walk the tile steps (elementwise in self and target),
    # and so does 'mean' of mse and bce, divided by the whole input's count,
    # not a tile's (since branch spyre21g); huber and smooth_l1 with 'mean'
    # run whole (CPU's value of an element depends on its position in the
    # whole tensor: docs/ktir.md).
    x, y = _operands(name, dtype, (1000, 300), special=name != "bce")
    for reduction, r in REDUCTIONS.items():
        d = x.to("tpu").requires_grad_()
        loss = LOSSES[name](d, y.to("tpu"), reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        got = d.grad.cpu()
        from torch_tpu_eager import spyre

        s = spyre.last_schedule()[-1]
        whole = reduction == "mean" and name in ("huber", "smooth_l1")
        if whole:
            assert s["executed"] == "whole", s["whole_reason"]
        else:
            assert s["executed"] == "tiles" and s["tile_steps"] > 1, (reduction, s["whole_reason"])
        g = torch.ones(()) if r else torch.ones(x.shape)
        _check(got, BACKWARD[name](g, x.float(), y.float(), r), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", ["bce", "mse"])
@pytest.mark.parametrize("shape", [(2000, 300), (37, 2000), (7, 33)], ids=["2000x300", "37x2000", "7x33"])
def test_mean_loss_backward_on_tiles_uses_the_whole_count(spyre_target, name, dtype, shape):
    # A 'mean' gradient with a grad_output other than 1, on 2-4 tile steps per
    # core (2000x300) and on one row per core (37x2000): every element equals
    # df16 of CPU's float32 kernel run on the whole df16 tensors.
    from torch_tpu_eager import metrics, reset_metrics, spyre

    x, y = _operands(name, dtype, shape, special=name != "bce")
    g = store(torch.tensor(0.3712), dtype) if dtype != torch.float32 else torch.tensor(0.3712)
    reset_metrics()
    got = BACKWARD[name](g.to("tpu"), x.to("tpu"), y.to("tpu"), 1).cpu()
    s = spyre.last_schedule()[-1]
    assert s["executed"] == "tiles", s["whole_reason"]
    assert metrics()["library_calls"] == 0
    _check(got, BACKWARD[name](g.float(), x.float(), y.float(), 1), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_mse_loss_of_a_broadcast_target(spyre_target, dtype):
    # F.mse_loss broadcasts a [300] target to the rows (a stride-0 view): each
    # tile step reads its rows of the expanded view.
    x, y = _operands("mse", dtype, (1000, 300))
    with pytest.warns(UserWarning):
        got = F.mse_loss(x.to("tpu"), y[0].to("tpu")).cpu()
    s = _last_schedule()
    _check(got, _ring_sum((x.float() - y[0].float()) ** 2, s) / float(x.numel()), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("wshape", [(1000, 300), (300,)], ids=["full", "broadcast"])
def test_bce_with_a_weight_on_the_ring(spyre_target, dtype, wshape):
    # F.binary_cross_entropy expands the weight to the input's sizes: a third
    # row operand split with the rows (a stride-0 view for a broadcast one).
    from torch_tpu_eager import metrics, reset_metrics

    x, y = _operands("bce", dtype, (1000, 300), special=True)
    w = store(_inputs(dtype, seed=54, shape=wshape, positive=True).float(), dtype)
    wx = w.float().expand(x.shape)
    for reduction in ("mean", "sum", "none"):
        reset_metrics()
        got = F.binary_cross_entropy(x.to("tpu"), y.to("tpu"), w.to("tpu"), reduction=reduction).cpu()
        s = _last_schedule()
        elementwise = F.binary_cross_entropy(x.float(), y.float(), wx, reduction="none")
        if reduction == "none":
            _check(got, elementwise, dtype)
        else:
            total = _ring_sum(elementwise, s)
            _check(got, total / float(x.numel()) if reduction == "mean" else total, dtype)
        assert metrics()["library_calls"] == 0


def test_run_ktir_runs_dumped_loss_and_trace(spyre_target, tmp_path, monkeypatch):
    # A dumped loss / trace program runs with run_ktir (one tile per core,
    # the cores' partials summed along the ring): the compiled region's value.
    from torch_tpu_eager import spyre

    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    a, b = _operands("mse", torch.float32, (256, 64))
    loss = F.mse_loss(a.to("tpu"), b.to("tpu")).cpu()  # 8 rows per core: one tile each
    tr = torch.trace(a.to("tpu")).cpu()
    mse_path, trace_path = sorted(tmp_path.glob("*.ktir"))
    assert "mse_loss(" in mse_path.read_text() and "trace(" in trace_path.read_text()
    (got,) = spyre.run_ktir(str(mse_path), a, b)
    assert same(got.reshape(()), loss) == 0
    (got,) = spyre.run_ktir(str(trace_path), a)
    assert same(got.reshape(()), tr) == 0
    torch.testing.assert_close(loss, F.mse_loss(a, b))


BUILDS = [(), ("avx512f",), ("avx512f", "avx2", "f16c")]
BUILD_IDS = ["widest", "avx2", "baseline"]


@pytest.mark.parametrize("off", BUILDS, ids=BUILD_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", [(40, 17), (96, 513), (1000, 300)], ids=["40x17", "96x513", "1000x300"])
def test_mse_of_16bit_tiles_in_each_build(spyre_target, off, dtype, shape):
    # mse_loss of 16-bit tiles squares their differences from the exact f32
    # values of the 16-bit bits (no f32 copies): every build (AVX-512, AVX2,
    # baseline widening), row lengths around the vector widths and the
    # widening's 512-value blocks, special values, a transposed (strided)
    # operand pair, and the benchmark's mse_loss(x * 0.5, x) (a tile op first).
    from difftest import cpu_features_off

    for special in (False, True):
        x, y = _operands("mse", dtype, shape, special)
        cases = [(x, y, x.float(), y.float())]
        cases.append((x.t(), y.t(), x.float().t(), y.float().t()))
        half = store(x.float() * 0.5, dtype).float()  # the mul's one df16 rounding
        for a, b, a32, b32 in cases:
            with cpu_features_off(*off):
                got = {r: F.mse_loss(a.to("tpu"), b.to("tpu"), reduction=r).cpu() for r in ("none", "sum")}
                s = _last_schedule()
            _check(got["none"], F.mse_loss(a32, b32, reduction="none"), dtype)
            _check(got["sum"], _ring_sum(F.mse_loss(a32, b32, reduction="none").contiguous(), s), dtype)
        with cpu_features_off(*off):
            got = F.mse_loss(x.to("tpu") * 0.5, x.to("tpu"), reduction="sum").cpu()
            s = _last_schedule()
        _check(got, _ring_sum(F.mse_loss(half, x.float(), reduction="none"), s), dtype)
