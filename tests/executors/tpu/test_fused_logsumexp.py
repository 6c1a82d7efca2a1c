"""torch.logsumexp over the last dim of float32 tensors: recorded as one node and run as one
row loop fused with its elementwise producers (csrc/executors/tpu/logsumexp_row.inc).
CPU computes logsumexp as a composite (amax, masking of infinite maxes, sum of exp(x - max),
log, add); the row loop rounds every step as CPU's kernels do, so results are compared with
CPU PyTorch bit for bit (torch.equal; NaN rows by position)."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from difftest import REPO_ROOT, DEVICE, cpu_randn, run_avx2_child

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

ROOT = REPO_ROOT
INF, NAN = float("inf"), float("nan")

# Rows shorter than an AVX2 vector (8) and an AVX512 one (16), partial last vectors, whole
# vectors, the sum's 4-way split and 16-wide cascade levels (64, 1024 = 128 vectors), many
# levels (70,000), one row, a 3-d tensor.
SHAPES = [
    (1, 1),
    (3, 1),
    (4, 5),
    (2, 8),
    (5, 9),
    (3, 15),
    (3, 16),
    (7, 17),
    (6, 31),
    (3, 33),
    (2, 64),
    (9, 127),
    (4, 129),
    (5, 1000),
    (64, 1024),
    (3, 4099),
    (2, 70000),
    (1, 3000),
    (5, 17, 33),
    (2, 3, 1000),
    (4096, 3),
]


def assert_same(actual, expected):
    """Bit-equal values and the same shape; float32 NaNs with CPU's sign and payload too."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert torch.equal(actual[~nan], expected[~nan])
    if expected.dtype == torch.float32:
        assert torch.equal(actual.view(torch.int32), expected.view(torch.int32))


def region_children(fn, *args):
    """Runs fn on "tpu" copies of args and reads the result; returns it and, for every fused
    region that ran, the names of the ATen ops called inside it (torch.profiler children of
    its "tpu::" range)."""
    dev = [a.to("tpu") for a in args]
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn(*dev).cpu()

    def below(ev):
        names = []
        for c in ev.cpu_children:
            names += [c.name] + below(c)
        return names

    return out, [below(e) for e in prof.events() if e.name.startswith("tpu::")]


def _producers(x, b):
    return x * 2 + b


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("keepdim", [False, True])
def test_producers_and_logsumexp_match_cpu_exactly(shape, keepdim):
    x, b = cpu_randn(*shape, seed=1) * 8, cpu_randn(*shape, seed=2)
    expected = torch.logsumexp(_producers(x, b), -1, keepdim=keepdim)
    xd, bd = x.to("tpu"), b.to("tpu")
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    actual = torch.logsumexp(_producers(xd, bd), dim=-1, keepdim=keepdim).cpu()
    m = torch_tpu_eager.metrics()
    assert_same(actual, expected)
    assert m["ops_recorded"] == 3, "logsumexp should be recorded as one node"
    assert m["regions_run"] == 1, "the producers and logsumexp should be one region"


@pytest.mark.parametrize("shape", [(1, 7), (37, 300), (2, 3, 64)])
def test_logsumexp_of_an_input_matches_cpu_exactly(shape):
    x = cpu_randn(*shape, seed=3) * 30
    for dim in (-1, len(shape) - 1):
        assert_same(torch.logsumexp(x.to("tpu"), dim).cpu(), torch.logsumexp(x, dim))


def test_the_fused_row_loop_runs_no_aten_op_and_materializes_no_producer():
    # The fused loop calls no ATen kernel: no producer is computed into a buffer and no
    # composite (amax, exp, sum, ...) runs. The control, a single row of 40,000 floats,
    # falls back (CPU's sum then splits the row between threads): partition cuts it out
    # into a region of its own that runs CPU's logsumexp, after the producers' fused loop.
    x, b = cpu_randn(64, 1024, seed=4), cpu_randn(64, 1024, seed=5)
    out, regions = region_children(lambda t, u: torch.logsumexp(t * 2 + u, -1), x, b)
    assert_same(out, torch.logsumexp(x * 2 + b, -1))
    assert len(regions) == 1
    ops = {n for n in regions[0] if n.startswith("aten::")} - {"aten::item", "aten::_local_scalar_dense"}
    assert not ops, f"the fused region ran ATen ops: {sorted(ops)}"

    x1, b1 = cpu_randn(1, 40000, seed=6), cpu_randn(1, 40000, seed=7)
    out1, regions1 = region_children(lambda t, u: torch.logsumexp(t * 2 + u, -1), x1, b1)
    assert_same(out1, torch.logsumexp(x1 * 2 + b1, -1))
    assert len(regions1) == 2
    assert not {n for n in regions1[0] if n.startswith(("aten::mul", "aten::add"))}, regions1[0]
    assert "aten::logsumexp" in regions1[1]


def test_special_values_match_cpu():
    # An all -inf row (-inf), +inf entries (inf), +inf and -inf (inf), NaN (NaN), an infinite
    # max next to NaN, one finite entry among -inf, maxes near float32's limits, signed zeros,
    # exp's overflow and underflow edges.
    rows = [
        [-INF] * 5,
        [INF, 1, 2, 3, 4],
        [INF, -INF, 0, 0, 0],
        [NAN, 1, 2, 3, 4],
        [INF] * 5,
        [1, 2, NAN, INF, -INF],
        [-INF, 1, -INF, -INF, -INF],
        [3e38, 3e38, 3e38, 1, 0],
        [-3e38, -3e38, 0, 0, 0],
        [1e-45, 0, -0.0, 0, -0.0],
        [-0.0] * 5,
        [88.7, 88.8, 89, 0, 0],
        [-104, -103, -150, -88, -87],
    ]
    base = torch.tensor(rows)
    for cols in (5, 17, 40):  # scalar rows, one vector and a tail, several vectors
        x = base.repeat(1, 8)[:, :cols].contiguous()
        for keepdim in (False, True):
            assert_same(torch.logsumexp(x.to("tpu") + 0.0, -1, keepdim).cpu(), torch.logsumexp(x + 0.0, -1, keepdim))


def test_rows_sprinkled_with_special_values_match_cpu():
    g = torch.Generator().manual_seed(8)
    for cols in (1, 7, 8, 9, 16, 33, 100, 1024):
        x = torch.randn(50, cols, generator=g) * 50
        u = torch.rand(50, cols, generator=g)
        x[u < 0.05] = -INF
        x[(u > 0.05) & (u < 0.06)] = INF
        x[(u > 0.5) & (u < 0.505)] = NAN
        x[:3] = -INF
        assert_same(torch.logsumexp(x.to("tpu") * 1.0, -1).cpu(), torch.logsumexp(x * 1.0, -1))


def test_transcendental_producer():
    # The producer's sin runs in the fused tile loop with at::vec (SLEEF), while CPU's
    # torch.sin calls MKL's VML: they can differ in the last bit, so the end result is
    # compared within float32 tolerance. The row itself is exact for its input: the
    # materialized producer value gives CPU's logsumexp bit for bit.
    x, b = cpu_randn(37, 300, seed=9), cpu_randn(37, 300, seed=10)

    def prog(t, u):
        h = t.sin() * 2 + u
        return h, torch.logsumexp(h, -1)

    h_cpu, r_cpu = prog(x, b)
    h, r = prog(x.to("tpu"), b.to("tpu"))
    h, r = h.cpu(), r.cpu()
    torch.testing.assert_close(r, r_cpu)
    assert_same(r, torch.logsumexp(h, -1))


def test_autograd_matches_cpu():
    x, b = cpu_randn(37, 129, seed=11), cpu_randn(37, 129, seed=12)
    g = cpu_randn(37, seed=13)

    def prog(dev):
        xs = x.to(dev).requires_grad_()
        y = torch.logsumexp(xs * 2 + b.to(dev), -1)
        y.backward(g.to(dev))
        return y.detach().cpu(), xs.grad.cpu()

    # The backward's exp(x - lse) reads lse of shape [37, 1] broadcast along each row and
    # fuses into a loop: bit for bit with CPU's exp under the "cpu" fused math routines
    # (the default "sleef" exp is within 1 ulp, test_fused_math.py).
    previous = torch_tpu_eager.fused_math()
    torch_tpu_eager.set_fused_math("cpu")
    try:
        (y, gx), (y_cpu, gx_cpu) = prog("tpu"), prog("cpu")
    finally:
        torch_tpu_eager.set_fused_math(previous)
    assert_same(y, y_cpu)
    assert_same(gx, gx_cpu)


@pytest.mark.parametrize(
    "case", ["dim0", "two_dims", "int64", "transposed", "transposed_producer", "empty_rows", "one_long_row"]
)
def test_other_cases_fall_back_and_match_cpu(case):
    # "transposed_producer": CPU's x.t() * 2 keeps the transposed layout, and its sum over
    # the strided last dim adds in another order than over a contiguous one.
    x = cpu_randn(17, 19, 5, seed=14)
    fn, arg = {
        "dim0": (lambda t: torch.logsumexp(t * 2, 0), x),
        "two_dims": (lambda t: torch.logsumexp(t * 2, (1, 2)), x),
        "int64": (lambda t: torch.logsumexp(t, -1), torch.arange(60).reshape(6, 10)),
        "transposed": (lambda t: torch.logsumexp(t.t(), -1), cpu_randn(33, 9, seed=15)),
        "transposed_producer": (lambda t: torch.logsumexp(t.t() * 2, -1), cpu_randn(333, 129, seed=17)),
        "empty_rows": (lambda t: torch.logsumexp(t * 2, -1), torch.zeros(0, 7)),
        "one_long_row": (lambda t: torch.logsumexp(t * 2, -1), cpu_randn(1, 50000, seed=16)),
    }[case]
    assert_same(fn(arg.to("tpu")).cpu(), fn(arg))


_AVX2_CHILD = r"""
import json, torch, torch_tpu_eager
g = torch.Generator().manual_seed(0)
res = {"capability": torch.backends.cpu.get_cpu_capability(), "bad": []}
for shape in [(3, 5), (4, 8), (5, 9), (3, 16), (7, 17), (5, 1000), (64, 1024), (2, 3, 33)]:
    x, b = torch.randn(*shape, generator=g) * 8, torch.randn(*shape, generator=g)
    x.view(-1)[x.numel() // 2] = float("nan")  # one NaN row: its sign and payload are compared too
    r = torch.logsumexp(x.to("tpu") * 2 + b.to("tpu"), -1).cpu()
    if not torch.equal(r.view(torch.int32), torch.logsumexp(x * 2 + b, -1).view(torch.int32)):
        res["bad"].append(list(shape))
print(json.dumps(res))
"""


def test_avx2_capability_matches_cpu_exactly(tmp_path):
    # ATEN_CPU_CAPABILITY=avx2 makes CPU's kernels and the row loop both use AVX2 code.
    assert run_avx2_child(_AVX2_CHILD, tmp_path)["bad"] == []


@pytest.mark.parametrize(
    "payload",
    [0x7FC00000, 0xFFC00000, 0x7FC12345, 0xFFFFFFFF, 0x7F800001],
    ids=["nan", "minus_nan", "payload", "all_ones", "signaling"],
)
@pytest.mark.parametrize("cols", [3, 17, 1025])
def test_nan_rows_have_cpu_bits(payload, cols):
    # CPU's composite gives the default quiet NaN for a row holding any NaN; the row
    # loop's max (at::vec::maximum) would give an all-ones NaN.
    x = cpu_randn(4, cols, seed=21)
    x.view(torch.int32)[2, cols // 2] = payload - (1 << 32) if payload >= 1 << 31 else payload
    assert x[2].isnan().any()
    for fn in (lambda t: torch.logsumexp(t, -1), lambda t: torch.logsumexp(t * 2 + 1, -1)):
        assert_same(fn(x.to("tpu")).cpu(), fn(x))
