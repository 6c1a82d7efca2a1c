"""Order statistics over the split rows on the ring (issue 21): sort, topk,
kthvalue, median, nanmedian and mode over dim 0 keep per core a stable
sorted run of its rows (per column), merged in tile order and then in core
order, and read their results off the merged order (docs/ktir.md, "Order
statistics"), instead of running the whole column as a library call.

References: CPU PyTorch. sort(stable=True) and median/nanmedian (whose CPU
index rule is the stable order's: equal values in row order) are compared
with CPU bit for bit, values and indices. Where CPU's index among equal
values is its selection algorithm's (sort(stable=False), topk, kthvalue,
mode) the values are compared with CPU's (== per element, NaN equal to NaN)
and the indices with the rule docs/ktir.md defines, computed here from CPU's
stable sort: topk the first k of the stable order, kthvalue its k-th,
mode the last row holding CPU's mode value. Inputs: many ties, NaN, -0.0,
0.0 and +-inf, as the device holds them (16-bit values are df16 values),
float16, bfloat16, float32 and int64, shapes whose cores run 1 to 4 tile
steps.
"""

import pytest
import torch

from difftest import requires_tpu
from test_spyre_numerics import same
from test_spyre_ring import _schedule
from test_spyre_ring_extrema import SCAN_IDS, SCAN_SHAPES, _same_bits, _special

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int64]
IDS = ["f16", "bf16", "f32", "i64"]


def _stable(x, descending=False):
    return torch.sort(x, dim=0, stable=True, descending=descending)


@pytest.fixture(autouse=True)
def _fresh_metrics():
    from torch_tpu_eager import reset_metrics

    reset_metrics()


def _selection_chains(dtype):
    """Ring chains of a selection over `dtype` keys (docs/ktir.md, "Selection"): per
    key byte a chain of histograms and a broadcast of the digit found, then one
    chain of the counts of equal keys."""
    return 2 * dtype.itemsize + 1


def _on_ring(name, dtype=None):
    """The region walked tiles with the order statistic on the ring, no library
    call; a selection (topk, kthvalue, median, nanmedian over `dtype`) ran its
    chains along the ring, the others one."""
    from torch_tpu_eager import metrics, metrics_report, reset_metrics

    selects = name.split(".")[0] in ("topk", "kthvalue", "median", "nanmedian")
    s = _schedule(_selection_chains(dtype) if selects else 1)
    assert metrics()["library_calls"] == 0, name
    assert "spyre_library_call." not in metrics_report(), name
    reset_metrics()
    return s


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=SCAN_IDS)
def test_sort_merges_stable_runs(spyre_target, dtype, shape):
    a = _special(dtype, shape, 61)
    d = a.to("tpu")
    for desc in (False, True):
        v, i = torch.sort(d, dim=0, stable=True, descending=desc)
        v, i = v.cpu(), i.cpu()
        _on_ring("sort")
        want = _stable(a, desc)
        assert v.dtype == dtype and i.dtype == torch.int64
        assert _same_bits(v, want.values) == 0 and torch.equal(i, want.indices), desc
        # stable=False: CPU's order of equal values is its sort's; the values
        # are CPU's, the indices the stable order's.
        v, i = d.sort(0, descending=desc)
        v, i = v.cpu(), i.cpu()
        assert same(v, a.sort(0, descending=desc).values) == 0
        assert torch.equal(i, want.indices)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=SCAN_IDS)
def test_median_nanmedian_equal_cpu_with_indices(spyre_target, dtype, shape):
    a = _special(dtype, shape, 62)
    if dtype != torch.int64:
        a[:, 1] = float("nan")  # an all-NaN column (nanmedian: NaN)
        a[:, 2] = 0.0
        a[::3, 2] = -0.0
    d = a.to("tpu")
    for name, f in [("median", torch.median), ("nanmedian", torch.nanmedian)]:
        for keepdim in (False, True):
            got = f(d, 0, keepdim=keepdim)
            v, i = got.values.cpu(), got.indices.cpu()
            _on_ring(name, dtype)
            want = f(a, 0, keepdim=keepdim)
            assert _same_bits(v, want.values) == 0, name
            if name == "nanmedian" and dtype != torch.int64:
                # An all-NaN column: CPU's index is its nth_element's; the ring's
                # the column's first NaN (row 0 here).
                assert int(i.reshape(-1)[1]) == 0
                i, w = i.reshape(-1).clone(), want.indices.reshape(-1).clone()
                i[1] = w[1] = 0
                assert torch.equal(i, w)
            else:
                assert torch.equal(i, want.indices), name
        # Every element (median(), nanmedian()): the flattened elements in one
        # run. CPU selects the value alone (any of equal values, +-0); the
        # ring's is the stable order's element.
        got = f(d).cpu()
        _on_ring(name, dtype)
        assert same(got, f(a)) == 0, name
        flat = _stable(a.reshape(-1)).values
        n = flat.numel() - (int(flat.isnan().sum()) if dtype != torch.int64 else 0)
        if name == "median":
            pos = n if n < flat.numel() else (n - 1) // 2
        else:
            pos = (n - 1) // 2 if n > 0 else 0
        assert _same_bits(got, flat[pos]) == 0, name


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=SCAN_IDS)
def test_topk_kthvalue_values_and_the_stable_index_rule(spyre_target, dtype, shape):
    a = _special(dtype, shape, 63)
    d = a.to("tpu")
    rows = shape[0]
    for k in (1, 5, rows // 2 + 1):
        for largest in (True, False):
            v, i = d.topk(k, 0, largest=largest)
            v, i = v.cpu(), i.cpu()
            _on_ring("topk", dtype)
            assert same(v, a.topk(k, 0, largest=largest).values) == 0
            ref = _stable(a, largest)
            assert torch.equal(i, ref.indices[:k]) and _same_bits(v, ref.values[:k]) == 0
    for k in (1, 7, rows):
        for keepdim in (False, True):
            v, i = d.kthvalue(k, 0, keepdim=keepdim)
            v, i = v.cpu(), i.cpu()
            _on_ring("kthvalue", dtype)
            assert same(v, a.kthvalue(k, 0, keepdim=keepdim).values) == 0
            ref = _stable(a)
            assert torch.equal(i.reshape(-1), ref.indices[k - 1].reshape(-1))
            assert _same_bits(v.reshape(-1), ref.values[k - 1].reshape(-1)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=SCAN_IDS)
def test_mode_value_of_cpu_and_its_last_row(spyre_target, dtype, shape):
    # Without NaN: CPU's mode sorts with `<`, for which NaN is unordered.
    a = _special(dtype, shape, 64)
    if dtype != torch.int64:
        a = torch.where(a.isnan(), torch.zeros((), dtype=dtype), a)
    d = a.to("tpu")
    v, i = d.mode(0)
    v, i = v.cpu(), i.cpu()
    _on_ring("mode")
    want = a.mode(0)
    assert same(v, want.values) == 0
    # The index: the last row holding the mode value (equal values, +-0 too).
    hit = a == want.values.unsqueeze(0)
    rows = torch.arange(shape[0]).unsqueeze(1).expand(shape)
    last = torch.where(hit, rows, torch.full_like(rows, -1)).amax(0)
    assert torch.equal(i, last)
    assert _same_bits(v, a.gather(0, last.unsqueeze(0)).squeeze(0)) == 0


def test_order_results_feed_later_ops_and_round_trip(spyre_target):
    # A sort whose values feed an elementwise op (after the ring), argsort,
    # a 1-D input; the printed program parses back and verifies.
    from torch_tpu_eager import spyre

    a = _special(torch.float16, (300, 40), 65)
    d = a.to("tpu")
    got = (d.sort(0).values * 2).cpu()
    _on_ring("sort")
    assert same(got, a.sort(0).values * 2) == 0
    text = spyre.dump_ktir()
    text = text if text.endswith("\n") else text + "\n"
    assert "sort.stable(" in text and "reduce=ring" in text
    assert spyre.format_ktir(text) == text
    spyre.verify_ktir(text)
    assert torch.equal(d.argsort(dim=0, stable=True).cpu(), a.argsort(dim=0, stable=True))
    _on_ring("argsort")
    # out= forms write their out operands on the ring.
    o = (torch.empty(300, 40, dtype=torch.float16, device="tpu"), torch.empty(300, 40, dtype=torch.long, device="tpu"))
    torch.sort(d, dim=0, stable=True, out=o)
    want = _stable(a)
    assert _same_bits(o[0].cpu(), want.values) == 0
    _on_ring("sort.values_stable")
    assert torch.equal(o[1].cpu(), want.indices)
    m = (torch.empty(40, dtype=torch.float16, device="tpu"), torch.empty(40, dtype=torch.long, device="tpu"))
    torch.median(d, 0, out=m)
    assert _same_bits(m[0].cpu(), a.median(0).values) == 0
    _on_ring("median.dim_values", torch.float16)
    assert torch.equal(m[1].cpu(), a.median(0).indices)
    col = a[:, 0].contiguous()
    v, i = col.to("tpu").sort(stable=True)
    assert _same_bits(v.cpu(), col.sort(stable=True).values) == 0 and torch.equal(
        i.cpu(), col.sort(stable=True).indices
    )


def test_run_ktir_runs_a_dumped_sort(spyre_target, tmp_path, monkeypatch):
    # A dumped order-statistic program runs with run_ktir (one tile per core):
    # the cores' runs merged along the ring give CPU's stable sort.
    from torch_tpu_eager import spyre

    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    a = _special(torch.float32, (96, 20), 66)
    torch.sort(a.to("tpu"), dim=0, stable=True).values.cpu()
    (path,) = sorted(tmp_path.glob("*.ktir"))
    (vals,) = spyre.run_ktir(str(path), a)
    assert "sort.stable(" in path.read_text()
    assert _same_bits(vals.view(96, 20), _stable(a).values) == 0


def test_every_order_program_round_trips_and_verifies(spyre_target):
    # Each order statistic's printed program parses back to the same text and
    # passes the verifier (its op is an ATen op the verifier checks on meta
    # tensors, out= forms included), and the region ran on the ring.
    from torch_tpu_eager import spyre

    a = _special(torch.bfloat16, (150, 24), 67)
    d = a.to("tpu")
    cases = {
        "topk": lambda t: t.topk(4, 0, largest=False),
        "kthvalue": lambda t: t.kthvalue(5, 0, keepdim=True),
        "median": lambda t: t.median(0),
        "nanmedian": lambda t: (t.nanmedian(),),
        "mode": lambda t: t.nan_to_num(0.0).mode(0),
    }
    for name, f in cases.items():
        got = [r.cpu() for r in f(d)]
        want = f(a)
        for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
            assert same(g, w) == 0 if g.is_floating_point() else True, name
        s = spyre.last_schedule()[-1]
        # mode merges runs (one chain); the others select: per bfloat16 key
        # digit (2) a chain of histograms and a broadcast of the digit, then a
        # chain of the equal keys' counts.
        chains = 1 if name == "mode" else _selection_chains(torch.bfloat16)
        assert s["executed"] == "tiles" and s["ring_steps_run"] == chains * (s["cores_used"] - 1), name
        text = spyre.dump_ktir().split("\n\n")[-1]
        text = text if text.endswith("\n") else text + "\n"
        assert "reduce=ring" in text and name in text, name
        assert spyre.format_ktir(text) == text, name
        spyre.verify_ktir(text)


def _hop_bytes(rows, cols, stick=128):
    """Bytes of one ring hop carrying rows x cols int32 counts, each row padded to whole sticks."""
    return rows * (-(-cols * 4 // stick) * stick)


@pytest.mark.parametrize(
    "dtype, digits", [(torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 4)], ids=["bf16", "f16", "f32"]
)
@pytest.mark.parametrize("op", ["median", "kthvalue", "topk", "median_all"])
def test_selection_schedule_counts_every_pass(spyre_target, dtype, digits, op):
    # Hand derivation for 8 rows of 40 columns: one row per core, 8 cores, so
    # each chain along the ring is 7 hops. A selection over keys of `digits`
    # bytes runs, per digit, a chain of histograms (256 int32 counts per
    # column) and a broadcast of the digit found (1 per column), then a chain
    # of the counts of equal keys (1 per column): 2 * digits + 1 chains, each
    # hop stick padded. median() of every element selects over one column.
    from torch_tpu_eager.target import target_info

    a = _special(dtype, (8, 40), 70)
    f = {
        "median": lambda t: t.median(0).values,
        "kthvalue": lambda t: t.kthvalue(3, 0).values,
        "topk": lambda t: t.topk(2, 0).values,
        "median_all": lambda t: t.median(),
    }[op]
    got = f(a.to("tpu")).cpu()
    assert same(got, f(a)) == 0
    s = _on_ring(op.split("_")[0], dtype)
    assert s["executed"] == "tiles" and s["cores_used"] == 8 and s["rows_per_core"] == 1
    hops = 7
    assert s["ring_steps_run"] == (2 * digits + 1) * hops
    assert s["ring_steps"] == (2 * digits + 1) * hops
    if op == "median_all":  # one column: its 256 counts in one row of sticks
        histogram, one = _hop_bytes(1, 256), _hop_bytes(1, 1)
    else:  # a row of 40 counts per digit value
        histogram, one = _hop_bytes(256, 40), _hop_bytes(1, 40)
    assert s["partial_bytes"] == histogram
    assert s["ring_bytes"] == hops * (digits * (histogram + one) + one)
    info = target_info("spyre")
    # Each hop: its latency, then its bytes over the link (the 2 * digits + 1 short chains add most latency).
    assert s["ring_latency_s"] == pytest.approx(s["ring_steps"] * info["ring_hop_latency_s"], rel=1e-12)
    assert s["ring_s"] == pytest.approx(s["ring_latency_s"] + s["ring_bytes"] / info["ring_link_bandwidth"], rel=1e-12)
    assert s["executed_s"] == pytest.approx(max(c["end_s"] for c in s["per_core"]) + s["ring_s"], rel=1e-12)


def test_merged_runs_count_one_chain(spyre_target):
    # sort merges sorted runs: one chain of cores_used - 1 hops (unchanged).
    a = _special(torch.bfloat16, (8, 40), 71)
    got = torch.sort(a.to("tpu"), dim=0, stable=True).values.cpu()
    assert _same_bits(got, _stable(a).values) == 0
    s = _on_ring("sort")
    assert s["cores_used"] == 8 and s["ring_steps_run"] == 7 and s["ring_steps"] == 7
