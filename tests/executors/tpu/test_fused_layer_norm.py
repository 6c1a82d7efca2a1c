"""native_layer_norm fused with its elementwise producers: one loop over blocks of rows
runs the producers and CPU's row arithmetic (ATen's RowwiseMoments, rstd, the normalize
map), so the producers' value never reaches device memory. All three outputs (out, mean,
rstd) are compared with CPU's torch.native_layer_norm bit for bit (torch.equal)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from difftest import REPO_ROOT, DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion and metrics exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

ROOT = REPO_ROOT

# (input shape, normalized_shape): cols below one vector, not a multiple of 8 / 16 (Welford's
# scalar tail), whole vectors, deep cascades (cols >> 16 vectors), one row, 3-d / 4-d inputs
# and normalized_shape of two dims.
CASES = [
    ((1, 1), (1,)),
    ((3, 7), (7,)),
    ((5, 15), (15,)),
    ((2, 16), (16,)),
    ((4, 17), (17,)),
    ((6, 37), (37,)),
    ((3, 100), (100,)),
    ((2, 1000), (1000,)),
    ((1, 1024), (1024,)),
    ((4, 4097), (4097,)),
    ((2, 70001), (70001,)),
    ((2, 3, 1000), (1000,)),
    ((3, 5, 7), (5, 7)),
    ((2, 4, 33, 5), (33, 5)),
    ((513, 24), (24,)),
]
AFFINE = [(True, True), (True, False), (False, True), (False, False)]
AFFINE_IDS = ["weight+bias", "weight", "bias", "neither"]


def _params(normalized, weight, bias):
    w = cpu_randn(*normalized, seed=31) if weight else None
    b = cpu_randn(*normalized, seed=32) if bias else None
    return w, b


def _to(t, dev):
    return None if t is None else t.to(dev)


def _assert_outputs_equal(got, expected):
    for name, g, e in zip(("out", "mean", "rstd"), got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        assert torch.equal(g, e), f"{name} differs from CPU (max abs {(g - e).abs().max().item()})"


@pytest.mark.parametrize("shape,normalized", CASES, ids=[str(c[0]) for c in CASES])
@pytest.mark.parametrize("affine", AFFINE, ids=AFFINE_IDS)
@pytest.mark.parametrize("producer", ["input", "x+r", "x*2-b"])
def test_layer_norm_outputs_equal_cpu(shape, normalized, affine, producer):
    x, r = cpu_randn(*shape, seed=33) * 5 + 2, cpu_randn(*shape, seed=34)
    w, b = _params(normalized, *affine)

    def prog(x, r, w, b):
        if producer == "x+r":
            x = x + r
        elif producer == "x*2-b":
            x = x * 2 - r
        return torch.native_layer_norm(x, normalized, w, b, 1e-5)

    expected = prog(x, r, w, b)
    got = [t.cpu() for t in prog(x.to("tpu"), r.to("tpu"), _to(w, "tpu"), _to(b, "tpu"))]
    _assert_outputs_equal(got, expected)


@pytest.mark.parametrize("affine", AFFINE, ids=AFFINE_IDS)
def test_sleef_producer_chain_then_layer_norm_equals_cpu_on_the_same_input(affine):
    # The fused chain's SLEEF routines may differ from CPU's scalar tail by an ulp, so the
    # contract is layer_norm's: bit-equal to CPU's for the value the producers computed.
    x, r = cpu_randn(37, 300, seed=35), cpu_randn(37, 300, seed=36)
    w, b = _params((300,), *affine)

    def chain(x, r):
        return (x.sin() * 2 + r).exp() - 1.0

    h = chain(x.to("tpu"), r.to("tpu")).cpu()  # the producers alone, read back
    torch_tpu_eager.reset_metrics()
    got = [
        t.cpu()
        for t in torch.native_layer_norm(chain(x.to("tpu"), r.to("tpu")), (300,), _to(w, "tpu"), _to(b, "tpu"), 1e-5)
    ]
    assert torch_tpu_eager.metrics()["regions_run"] == 1, "chain and layer_norm should be one region"
    _assert_outputs_equal(got, torch.native_layer_norm(h, (300,), w, b, 1e-5))
    torch.testing.assert_close(got[0], torch.native_layer_norm(chain(x, r), (300,), w, b, 1e-5)[0])


def test_fused_path_does_not_materialize_the_producer():
    rows, cols = 64, 1000
    x, r = cpu_randn(rows, cols, seed=37).to("tpu"), cpu_randn(rows, cols, seed=38).to("tpu")
    w, b = cpu_randn(cols, seed=39).to("tpu"), cpu_randn(cols, seed=40).to("tpu")
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    y = F.layer_norm(x + r, (cols,), w, b)  # recorded only
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as cpu_prof:
        torch.tpu.synchronize()
    names = {e.name for e in cpu_prof.events()}
    # The op-by-op path would run CPU's add into a fresh temporary (aten::empty, aten::add
    # events inside the flush); the row loop runs no ATen op at all.
    assert "tpu::fused_add_native_layer_norm" in names, names
    assert not [n for n in names if n.startswith("aten::")], names
    assert torch_tpu_eager.metrics()["regions_run"] == 1
    # Only the output reaches device memory: not x + r, and not mean / rstd (nobody reads them).
    assert torch_tpu_eager.metrics()["bytes_materialized"] == rows * cols * 4
    assert torch.equal(y.cpu(), F.layer_norm(x.cpu() + r.cpu(), (cols,), w.cpu(), b.cpu()))


def test_mean_and_rstd_are_written_when_read():
    x, r = cpu_randn(9, 40, seed=41), cpu_randn(9, 40, seed=42)
    torch_tpu_eager.reset_metrics()
    out, mean, rstd = torch.native_layer_norm(x.to("tpu") + r.to("tpu"), (40,), None, None, 1e-3)
    got = [out.cpu(), mean.cpu(), rstd.cpu()]
    assert torch_tpu_eager.metrics()["bytes_materialized"] == (9 * 40 + 2 * 9) * 4
    _assert_outputs_equal(got, torch.native_layer_norm(x + r, (40,), None, None, 1e-3))


def test_producer_read_later_is_materialized_and_equal():
    x, w = cpu_randn(33, 65, seed=51), cpu_randn(65, seed=52)

    def prog(t, w):
        h = t * 3.0 - 1.0
        return F.layer_norm(h, (65,), w), h

    (y_cpu, h_cpu), (y_dev, h_dev) = prog(x, w), prog(x.to("tpu"), w.to("tpu"))
    assert torch.equal(y_dev.cpu(), y_cpu)
    assert torch.equal(h_dev.cpu(), h_cpu)


@pytest.mark.parametrize("affine", AFFINE, ids=AFFINE_IDS)
def test_autograd_through_fused_layer_norm_matches_cpu(affine):
    # Backward reads the mean / rstd the fused loop wrote; CPU's backward kernel then
    # gives CPU's gradients exactly.
    x, r, g = cpu_randn(6, 5, 70, seed=43), cpu_randn(6, 5, 70, seed=44), cpu_randn(6, 5, 70, seed=45)
    w, b = _params((5, 70), *affine)

    def prog(dev):
        xs = x.to(dev).requires_grad_()
        ws = w.to(dev).requires_grad_() if w is not None else None
        bs = b.to(dev).requires_grad_() if b is not None else None
        y = F.layer_norm(xs * 2 - r.to(dev), (5, 70), ws, bs, eps=1e-4)
        y.backward(g.to(dev))
        return [y.detach()] + [t.grad for t in (xs, ws, bs) if t is not None]

    for got, want in zip(prog("tpu"), prog("cpu")):
        assert torch.equal(got.cpu(), want)


def test_special_rows_match_cpu():
    # A constant row (variance 0: rstd = 1/sqrt(eps)), huge values, inf and nan.
    x = torch.tensor([[2.0] * 20, [1e30, -1e30] * 10, [float("inf")] + [0.0] * 19, [float("nan")] + [1.0] * 19])
    w, b = cpu_randn(20, seed=46), cpu_randn(20, seed=47)
    got = [t.cpu() for t in torch.native_layer_norm(x.to("tpu") + 0.0, (20,), w.to("tpu"), b.to("tpu"), 1e-5)]
    for g, e in zip(got, torch.native_layer_norm(x + 0.0, (20,), w, b, 1e-5)):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)


def test_fallback_cases_still_match_cpu():
    x = cpu_randn(12, 40, seed=48)
    w = cpu_randn(80, seed=49)
    cases = [
        lambda t, w: F.layer_norm(t.t() * 2, (12,)),  # transposed input
        lambda t, w: F.layer_norm(t + 1, (40,), w[::2]),  # strided weight
        lambda t, w: F.layer_norm(t + 1, (40,)) * 3,  # an epilogue after it
        lambda t, w: F.layer_norm(t.double() + 1, (40,)),  # float64
    ]
    for fn in cases:
        assert torch.equal(fn(x.to("tpu"), w.to("tpu")).cpu(), fn(x, w))
    xh = x.to(torch.bfloat16)
    torch.testing.assert_close(F.layer_norm(xh.to("tpu") * 2, (40,)).cpu(), F.layer_norm(xh * 2, (40,)))


@pytest.mark.parametrize("bad", ["normalized_shape", "weight_shape"])
def test_bad_input_raises_cpu_error_and_queue_stays_valid(bad):
    x = cpu_randn(4, 10, seed=50)

    def prog(t):
        if bad == "normalized_shape":
            return F.layer_norm(t + 1, (7,))
        return F.layer_norm(t + 1, (10,), torch.ones(9, device=t.device))

    with pytest.raises(RuntimeError) as cpu_err:
        prog(x)
    xd = x.to("tpu")
    with pytest.raises(RuntimeError) as dev_err:
        prog(xd).cpu()
    assert str(cpu_err.value).split("\n")[0] == str(dev_err.value).split("\n")[0]
    assert torch.equal(F.layer_norm(xd + 1, (10,)).cpu(), F.layer_norm(x + 1, (10,)))


AVX2_PROGRAM = textwrap.dedent("""
    import torch, torch_tpu_eager
    assert torch.backends.cpu.get_cpu_capability() == "AVX2", torch.backends.cpu.get_cpu_capability()
    bad = []
    # 1000, 1024, 1072 and 4352: whole AVX2 vectors of 8 to 68 chunks (grouped moments).
    for i, (shape, n) in enumerate([((3, 7), 7), ((5, 37), 37), ((4, 1000), 1000), ((2, 4097), 4097),
                                    ((2, 3, 64), 64), ((9, 1024), 1024), ((5, 1072), 1072), ((3, 4352), 4352)]):
        g = torch.Generator().manual_seed(i)
        x, r = torch.randn(*shape, generator=g) * 3, torch.randn(*shape, generator=g)
        w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
        for wb in [(w, b), (w, None), (None, b), (None, None)]:
            want = torch.native_layer_norm(x * 2 - r, (n,), *wb, 1e-5)
            dev = [None if t is None else t.to("tpu") for t in wb]
            got = torch.native_layer_norm(x.to("tpu") * 2 - r.to("tpu"), (n,), *dev, 1e-5)
            if not all(torch.equal(a.cpu(), e) for a, e in zip(got, want)):
                bad.append((shape, wb[0] is not None, wb[1] is not None))
    print("MISMATCHES", bad)
""")


def test_avx2_capability_matches_cpu_in_a_subprocess(tmp_path):
    script = tmp_path / "avx2_layer_norm.py"
    script.write_text(AVX2_PROGRAM)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["ATEN_CPU_CAPABILITY"] = "avx2"
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "MISMATCHES []" in proc.stdout, proc.stdout


# QA finding: without bias CPU's loop still adds 0, which turns a -0 product into +0;
# torch.equal cannot see the sign of zero, so compare sign bits too.
@pytest.mark.parametrize("case", ["weight_only_negative", "no_params_rstd_zero"])
def test_sign_of_zero_matches_cpu(case):
    if case == "weight_only_negative":
        x = torch.full((3, 16), 2.5)  # constant rows: x - mean is +0
        w, b = -torch.ones(16), None
    else:
        # The variance overflows (rstd is 0) while the mean stays finite: (x - mean) * 0 is -0 below the mean.
        x = torch.cat([torch.tensor([3e38, 3e38]), torch.linspace(-2, 2, 18)]).reshape(1, 20)
        w = b = None

    def fn(t, w, b):
        return F.layer_norm(t * 1.0, t.shape[-1:], w, b)  # a producer: the fused row loop

    def dev(v):
        return None if v is None else v.to("tpu")

    got, want = fn(x.to("tpu"), dev(w), dev(b)).cpu(), fn(x, w, b)
    assert torch.equal(got.signbit(), want.signbit())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("cols", [7, 300, 1024, 4097])
def test_row_pairs_with_different_statistics_equal_cpu(cols):
    # Each row's statistics are its own: neighbouring rows of very different scales, a
    # constant row (variance 0), a row holding inf and one holding NaN, over an odd row
    # count, each give CPU's values (a row loop that took its moments several rows at a
    # time must keep them apart).
    rows = 9
    x = cpu_randn(rows, cols, seed=61)
    scales = torch.tensor([1e-3, 1e4, 1.0, 0.0, 3.0, 1.0, 1.0, 7.5, 1e-20]).unsqueeze(1)
    x = x * scales + torch.arange(rows, dtype=torch.float32).unsqueeze(1) * 100
    x[5, cols // 2] = float("inf")
    x[6, 0] = float("nan")
    r = cpu_randn(rows, cols, seed=62)
    w, b = cpu_randn(cols, seed=63), cpu_randn(cols, seed=64)
    for args in ((w, b), (None, None)):
        expected = torch.native_layer_norm(x + r, (cols,), *args, 1e-5)
        dev = [_to(t, "tpu") for t in args]
        got = [t.cpu() for t in torch.native_layer_norm(x.to("tpu") + r.to("tpu"), (cols,), *dev, 1e-5)]
        for g, e in zip(got, expected):  # bit for bit, NaN where CPU has NaN
            torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
