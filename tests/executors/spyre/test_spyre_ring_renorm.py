"""renorm on the Spyre ring (issue 21, branch spyre21s): renorm(x, p, dim,
maxnorm) scales each slice along `dim` by maxnorm / (norm + 1e-7) where the
slice's p-norm exceeds maxnorm. The norm reduces every dim but `dim`, so
with dim != 0 it reduces the split rows: f32 partials of the df16 powers
(as norm's), summed over the ring, one root, CPU's scale factor of it, and
a normalizing pass multiplying each row by it. With dim 0 each row is its
own slice: row-local, each tile runs CPU's renorm.

The reference is independent of the executor: the inputs as the device holds
them (df16 values), the powers summed in the order docs/ktir.md defines
(each corelet's rows of each core's tile, corelet 0 then 1, tiles in order,
cores in order: test_spyre_ring's _ordered_total), the root, the factor
written out here in float32, x * factor rounded once with the df16 codec of
test_spyre_numerics. 16-bit results equal it with 0 mismatches, float32 ones
bit for bit; each is also close to CPU's renorm. Before this branch a
renorm over dim 1 walked the tiles as if row-local and scaled each tile's
slice by that tile's norm.
"""

import pytest
import torch

from difftest import requires_tpu
from test_spyre_numerics import same, store
from test_spyre_ring import _close, _ordered_total, _schedule
from test_spyre_ring_extrema import _norm_merge, _norm_partial, _norm_root, _special

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["f16", "bf16", "f32"]
SHAPES = [(64, 300), (1000, 300), (37, 2000), (200, 4, 75)]
SHAPE_IDS = ["64x300", "1000x300", "37x2000", "200x4x75"]


def _operand(dtype, shape, special):
    if special:
        return _special(dtype, shape, 61)
    g = torch.Generator().manual_seed(60)
    a = torch.randn(shape, generator=g) * 2
    return store(a, dtype) if dtype != torch.float32 else a


def _reference(x, sched, p, dim, maxnorm):
    dims = tuple(d for d in range(x.dim()) if d != dim)
    total = _ordered_total(x, sched, lambda lo, hi: _norm_partial(x[lo:hi], p, dims), _norm_merge(p))
    norm = _norm_root(total, p)
    factor = torch.where(norm > maxnorm, torch.tensor(maxnorm, dtype=torch.float32) / (norm + 1e-7), 1.0)
    return x * factor


def _renorm(form, d, p, dim, maxnorm):
    """renorm of device tensor `d` in `form`; renorm_ runs on a clone (flushed
    first, a region of its own) and out= into a fresh tensor. Returns (the
    call's result, the tensor it must be: None for renorm)."""
    if form == "renorm":
        return torch.renorm(d, p, dim, maxnorm), None
    if form == "renorm_":
        t = d.clone()
        torch.tpu.synchronize()
        return t.renorm_(p, dim, maxnorm), t
    out = torch.empty_like(d)
    return torch.renorm(d, p, dim, maxnorm, out=out), out


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("special", [False, True], ids=["randn", "nan_inf_zeros"])
@pytest.mark.parametrize("form", ["renorm", "renorm_", "out="])
def test_renorm_over_the_ring(spyre_target, dtype, shape, special, form):
    # renorm_ and renorm(out=) take the same ring plan since branch spyre22s
    # (before it renorm_ ran whole as a library call, in CPU's sum order, and
    # renorm.out whole); each returns the tensor it writes.
    from torch_tpu_eager import metrics, metrics_report, reset_metrics

    a = _operand(dtype, shape, special)
    d = a.to("tpu")
    x = a.float()
    for dim in range(1, a.dim()):
        dims = tuple(k for k in range(a.dim()) if k != dim)
        norms = torch.linalg.vector_norm(x.nan_to_num(0.0, 0.0, 0.0), 2, dims)
        maxnorm = float(norms.median())  # about half the slices are scaled
        for p in (2, 1, 3.0, float("inf")):
            reset_metrics()
            got, written = _renorm(form, d, p, dim, maxnorm)
            assert written is None or got is written
            got = got.cpu()
            s = _schedule()
            ref = _reference(x, s, p, dim, maxnorm)
            assert got.dtype == dtype and got.shape == a.shape
            want = ref if dtype == torch.float32 else store(ref, dtype)
            assert same(got, want) == 0, (p, dim)
            if not special:
                _close(got, torch.renorm(x, p, dim, maxnorm), dtype)
            assert metrics()["library_calls"] == 0, (p, dim)
            assert "spyre_library_call." not in metrics_report()
    assert same(d.cpu(), a) == 0  # renorm_ wrote its clone only


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_renorm_of_rows_is_row_local(spyre_target, dtype):
    # dim 0: each row is its own slice; the tiles run CPU's renorm on their rows.
    from torch_tpu_eager import spyre

    a = _operand(dtype, (1000, 300), False)
    x = a.float()
    maxnorm = float(torch.linalg.vector_norm(x, 2, 1).median())
    got = torch.renorm(a.to("tpu"), 2, 0, maxnorm).cpu()
    (s,) = spyre.last_schedule()
    assert s["executed"] == "tiles", s["whole_reason"]
    want = torch.renorm(x, 2, 0, maxnorm)
    assert same(got, want if dtype == torch.float32 else store(want, dtype)) == 0
    for form in ("renorm_", "out="):  # in place and out=: the same rows
        got, _ = _renorm(form, a.to("tpu"), 2, 0, maxnorm)
        assert same(got.cpu(), want if dtype == torch.float32 else store(want, dtype)) == 0
        (s,) = spyre.last_schedule()
        assert s["executed"] == "tiles", s["whole_reason"]


def test_renorm_feeds_later_ops(spyre_target):
    # The normalized rows are a value later ops of the region read.
    a = _operand(torch.float32, (1000, 300), False)
    maxnorm = float(torch.linalg.vector_norm(a, 2, 0).median())
    got = (torch.renorm(a.to("tpu"), 2, 1, maxnorm) * 3).cpu()
    _close(got, torch.renorm(a, 2, 1, maxnorm) * 3, torch.float32)


def test_renorm_inplace_updates_every_view_of_its_storage(spyre_target):
    # In place: the storage is rewritten, so a view taken before the call
    # reads the renormed values; an op after it reads them too.
    a = _operand(torch.bfloat16, (1000, 300), False)
    x = a.float()
    maxnorm = float(torch.linalg.vector_norm(x, 2, 0).median())
    d = a.to("tpu")
    head = d[:10]
    d.renorm_(2, 1, maxnorm)
    twice = (d * 2).cpu()
    s_ref = torch.renorm(x, 2, 1, maxnorm)
    got = d.cpu()
    _close(got, s_ref, torch.bfloat16)
    assert torch.equal(head.cpu(), got[:10])
    assert torch.equal(twice, got * 2)


def test_renorm_inplace_of_a_computed_value(spyre_target):
    # renorm_ of a value the region computes first (a tile op's rows): the
    # ring reads them, the normalizing pass writes them back.
    a = _operand(torch.float32, (1000, 300), False)
    maxnorm = float(torch.linalg.vector_norm(a * 2, 2, 0).median())
    got = ((a.to("tpu") * 2).renorm_(2, 1, maxnorm) + 1).cpu()
    _close(got, torch.renorm(a * 2, 2, 1, maxnorm) + 1, torch.float32)


def test_renorm_out_resizes_an_empty_out(spyre_target):
    # CPU resizes an empty out= to the result's shape; so does the device.
    a = _operand(torch.float32, (1000, 300), False)
    maxnorm = float(torch.linalg.vector_norm(a, 2, 0).median())
    out = torch.empty(0, device="tpu")
    got = torch.renorm(a.to("tpu"), 2, 1, maxnorm, out=out)
    assert got is out and out.shape == a.shape
    _close(out.cpu(), torch.renorm(a, 2, 1, maxnorm), torch.float32)


@pytest.mark.parametrize("bad", [(0.0, 1.0), (2.0, -1.0)], ids=["p0", "negative_maxnorm"])
@pytest.mark.parametrize("form", ["renorm_", "out="])
def test_renorm_inplace_and_out_bad_arguments_raise_as_cpu(spyre_target, bad, form):
    # CPU's error type at the call, and nothing written.
    p, maxnorm = bad

    def call(t):
        if form == "renorm_":
            return t.renorm_(p, 1, maxnorm)
        return torch.renorm(t, p, 1, maxnorm, out=torch.empty_like(t))

    a = _operand(torch.float32, (64, 30), False)
    with pytest.raises(Exception) as cpu:
        call(a.clone())
    d = a.to("tpu")
    with pytest.raises(type(cpu.value)):
        call(d)
        torch.tpu.synchronize()
    assert torch.equal(d.cpu(), a)
