"""The Spyre interpreter's elementwise chain pass (executors/spyre/chain_pass.h,
issue 21): a region of elementwise ops runs as one pass over blocks, each op
in float32 and (bfloat16 / float16) rounded once to df16.

The reference is test_spyre_numerics' independent one: each op is CPU's
float32 kernel on the whole tensor, its result rounded through df16 (ties
away, from the definition) and held as the dtype. float32 chains equal CPU's
op by op values bit for bit. The AVX-512, AVX2 and baseline builds of the pass
give the same bits (features switched off with difftest.cpu_features_off).
"""

import pytest
import torch

from difftest import cpu_features_off, report_count, requires_tpu
from test_spyre_numerics import df16_ref, store

pytestmark = requires_tpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
IDS = ["bf16", "f16", "f32"]

# Element counts: every tail length of a 32-float step below 64, a block of
# 512 and its neighbours, and counts over ATen's grain (32,768) that CPU's
# kernels split between threads, each chunk with its own scalar tail.
COUNTS = list(range(1, 65)) + [511, 512, 513, 1000, 32769, 40001, 300000]

# Values that meet every branch: NaN, +-inf, +-0, float32 denormals, exp's
# overflow / underflow edges (SLEEF's -104 and 100, the pass's 110), df16's
# range edges, and randn.
SPECIAL = [
    float("nan"),
    float("inf"),
    float("-inf"),
    0.0,
    -0.0,
    1e-40,
    -1e-40,
    2.0**-31,
    -(2.0**-31),
    88.0,
    -88.0,
    100.5,
    -104.5,
    110.5,
    -110.5,
    200.0,
    -200.0,
    6.0e4,
    -6.0e4,
    8.5e9,
    -8.5e9,
]


def _values(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 4
    k = min(n, len(SPECIAL))
    pos = torch.randperm(n, generator=g)[:k]
    x[pos] = torch.tensor(SPECIAL[:k])
    return x


def _device_values(x32, dtype):
    """What a dtype tensor holds on Spyre after the upload (df16 for 16-bit)."""
    return x32 if dtype == torch.float32 else df16_ref(x32.to(dtype).float()).to(dtype)


def _hold(t32, dtype):
    """An op's result as the region holds it: df16 then dtype (float32: as is)."""
    return t32 if dtype == torch.float32 else store(t32, dtype).float()


def _bits_equal(got, want):
    g, w = got.float(), want.float()
    nan = torch.isnan(w)
    assert torch.equal(torch.isnan(g), nan), int((torch.isnan(g) != nan).sum())
    if got.dtype == torch.float32:
        return int((g[~nan].view(torch.int32) != w[~nan].view(torch.int32)).sum())
    return int((got[~nan].view(torch.int16) != want.to(got.dtype)[~nan].view(torch.int16)).sum())


def _chain_count():
    return report_count("spyre_chain_pass.")


# op name -> (device function, reference function over float32 values)
UNARY = {
    "neg": (torch.neg, torch.neg),
    "abs": (torch.abs, torch.abs),
    "relu": (torch.relu, torch.relu),
    "sigmoid": (torch.sigmoid, torch.sigmoid),
    "silu": (torch.nn.functional.silu, torch.nn.functional.silu),
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=0.3), lambda a, b: torch.add(a, b, alpha=0.3)),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "sub_alpha": (lambda a, b: torch.sub(a, b, alpha=-1.7), lambda a, b: torch.sub(a, b, alpha=-1.7)),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "add_scalar": (lambda a, b: a + 0.1, lambda a, b: a + 0.1),
    "mul_scalar": (lambda a, b: a * 1.7, lambda a, b: a * 1.7),
    "div_scalar": (lambda a, b: a / 3.0, lambda a, b: a / 3.0),
}


def _passes_expected(uses_exp):
    """Chain-pass launches expected for one chain: sigmoid / silu take the pass only
    when CPU's kernels of them run SLEEF's expf (ATen's AVX2 or AVX512 capability),
    in every build of the pass (AVX-512, AVX2 + FMA + F16C, baseline)."""
    return 1 if not uses_exp or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else 0


def _run_chain(dev_fn, ref_fn, xs, dtype):
    """(device result, reference) of dev_fn(*xs) followed by * 1.0 + 0 (a chain of 3)."""
    held = [_device_values(x, dtype) for x in xs]
    before = _chain_count()
    got = (dev_fn(*[h.to("tpu") for h in held]) * 2.0 - 1.0).cpu()
    expected = _passes_expected(dev_fn in (torch.sigmoid, torch.nn.functional.silu))
    assert _chain_count() == before + expected, "the chain pass did not run as expected"
    r = _hold(ref_fn(*[h.float() for h in held]), dtype)
    r = _hold(r * 2.0, dtype)
    r = _hold(r - 1.0, dtype)
    return got, r.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_in_chain_every_tail(spyre_target, dtype, name):
    dev, ref = UNARY[name]
    for n in COUNTS:
        got, want = _run_chain(dev, ref, [_values(n, n)], dtype)
        assert _bits_equal(got, want) == 0, (name, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_in_chain_every_tail(spyre_target, dtype, name):
    dev, ref = BINARY[name]
    for n in COUNTS[::3] + [40001]:
        got, want = _run_chain(dev, ref, [_values(n, n), _values(n, n + 1)], dtype)
        assert _bits_equal(got, want) == 0, (name, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_every_op_in_chain_some_tails(spyre_target, dtype):
    """The fast tier's sample of the two tests above (the slow tier runs them whole)."""
    for n in (1, 31, 33, 513, 40001):
        for name, (dev, ref) in sorted(UNARY.items()):
            got, want = _run_chain(dev, ref, [_values(n, n)], dtype)
            assert _bits_equal(got, want) == 0, (name, n)
        for name, (dev, ref) in sorted(BINARY.items()):
            got, want = _run_chain(dev, ref, [_values(n, n), _values(n, n + 1)], dtype)
            assert _bits_equal(got, want) == 0, (name, n)


def _chain6(x):
    return (torch.sigmoid(x * 1.5 + 0.25) * x - 0.5).abs()


def _chain6_ref(x32, dtype):
    t = _hold(x32 * 1.5, dtype)
    t = _hold(t + 0.25, dtype)
    t = _hold(torch.sigmoid(t), dtype)
    t = _hold(t * x32, dtype)
    t = _hold(t - 0.5, dtype)
    return _hold(t.abs(), dtype).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(1000, 300), (77, 37), (3, 5), (40001, 1)])
def test_benchmark_chain_large_random(spyre_target, dtype, shape):
    x = _device_values(torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 6, dtype)
    before = _chain_count()
    got = _chain6(x.to("tpu")).cpu()
    assert _chain_count() == before + _passes_expected(uses_exp=True)
    assert _bits_equal(got, _chain6_ref(x.float(), dtype)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_each_cpu_build_same_bits(spyre_target, dtype):
    x = _device_values(_values(40001, 9).reshape(40001, 1), dtype)
    want = _chain6_ref(x.float(), dtype)
    outs = []
    for off in [(), ("avx512f",), ("avx512f", "avx2", "fma", "f16c")]:
        with cpu_features_off(*off):
            before = _chain_count()
            got = (_chain6(x.to("tpu")) + torch.nn.functional.silu(x.to("tpu"))).cpu()
            assert _chain_count() == before + _passes_expected(uses_exp=True), off
        outs.append(got)
    s = _hold(torch.nn.functional.silu(x.float()), dtype)
    want = _hold(want.float() + s, dtype).to(dtype)
    for got in outs:
        assert _bits_equal(got, want) == 0
        assert _bits_equal(got, outs[0]) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_each_cpu_build_same_bits_without_exp(spyre_target, dtype):
    """A chain without sigmoid / silu takes the pass in every build (AVX-512, AVX2+FMA+F16C,
    baseline): the same bits, equal to the df16 reference."""
    x = _device_values(_values(40001, 11).reshape(40001, 1), dtype)
    t = _hold(x.float() * 1.5, dtype)
    t = _hold(t + 0.25, dtype)
    t = _hold(t.abs(), dtype)
    t = _hold(t * x.float(), dtype)
    t = _hold(t - 0.5, dtype)
    want = _hold(t.relu(), dtype).to(dtype)
    for off in [(), ("avx512f",), ("avx512f", "avx2", "fma", "f16c")]:
        with cpu_features_off(*off):
            before = _chain_count()
            got = (((x.to("tpu") * 1.5 + 0.25).abs() * x.to("tpu")) - 0.5).relu().cpu()
            assert _chain_count() == before + 1, off
        assert _bits_equal(got, want) == 0, off


def test_op_outside_the_vocabulary_runs_op_by_op(spyre_target):
    x = _device_values(torch.randn(64, 33, generator=torch.Generator().manual_seed(3)), torch.bfloat16)
    before = _chain_count()
    got = (torch.exp(x.to("tpu")) * 0.5).cpu()
    assert _chain_count() == before
    want = _hold(_hold(torch.exp(x.float()), torch.bfloat16) * 0.5, torch.bfloat16).to(torch.bfloat16)
    assert _bits_equal(got, want) == 0


def test_float32_chain_equals_cpu(spyre_target):
    x = torch.randn(513, 7, generator=torch.Generator().manual_seed(4)) * 30
    got = (torch.sigmoid(x.to("tpu") * 1.5 - 2) / 3 + torch.relu(-x.to("tpu"))).cpu()
    want = torch.sigmoid(x * 1.5 - 2) / 3 + torch.relu(-x)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_schedule_reports_the_tile_steps(spyre_target):
    from torch_tpu_eager import spyre

    x = torch.randn(1000, 300, dtype=torch.bfloat16).to("tpu")
    _chain6(x).cpu()
    sched = spyre.last_schedule()[0]
    assert sched["executed"] == "tiles"
    assert sched["tile_steps"] == sched["n_tiles"]


# The CPU builds of the pass: AVX-512, AVX2 + FMA + F16C, baseline.
BUILDS = [(), ("avx512f",), ("avx512f", "avx2", "fma", "f16c")]


def _chain11(x, y):
    """Eleven ops: the value passed on in registers (held), read back from a slot (t1, t2,
    t4, t5), a literal, a loaded input, and every function of the pass."""
    t1 = x * 1.5
    t2 = torch.add(t1, y, alpha=0.3)
    t4 = torch.nn.functional.silu(t2) / t1
    t5 = torch.neg(y)
    t7 = torch.sigmoid(t4 - t5)
    return torch.relu((t7 - 0.5).abs() * t2)


def _chain11_ref(x32, y32, dtype):
    h = lambda t: _hold(t, dtype)  # noqa: E731
    t1 = h(x32 * 1.5)
    t2 = h(torch.add(t1, y32, alpha=0.3))
    t4 = h(h(torch.nn.functional.silu(t2)) / t1)
    t5 = h(torch.neg(y32))
    t7 = h(torch.sigmoid(h(t4 - t5)))
    return h(torch.relu(h(h(h(t7 - 0.5).abs()) * t2))).to(dtype)


def _check_chain11_every_build(n, dtype, seed):
    x = _device_values(_values(n, seed), dtype)
    y = _device_values(_values(n, seed + 1) * 0.5, dtype)
    want = _chain11_ref(x.float(), y.float(), dtype)
    outs = []
    for off in BUILDS:
        with cpu_features_off(*off):
            before = _chain_count()
            got = _chain11(x.to("tpu"), y.to("tpu")).cpu()
            assert _chain_count() == before + _passes_expected(uses_exp=True), (n, off)
        assert _bits_equal(got, want) == 0, (n, off)
        outs.append(got)
    for got in outs[1:]:
        assert _bits_equal(got, outs[0]) == 0, n


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_long_chain_every_build_every_tail(spyre_target, dtype):
    """An eleven-op chain on every element count 1..64 and around a block and a
    chunk, with NaN / inf / denormals among the values: each build equal to the
    df16 reference and to each other."""
    for n in COUNTS[:-1]:
        _check_chain11_every_build(n, dtype, n)


def _edge_values():
    """exp's and df16's edges and their float32 neighbours, NaN of both signs, +-inf,
    +-0, denormals, float16's overflow edge: 4099 values in a random order."""
    base = [-110.5, -104.0, -103.97, -87.34, 88.72, 100.0, 100.01, 110.0, 110.1, 1e-40, 1.4e-45]
    base += [2.0**-31, 65504.0, 65520.0, 8.59e9, 3.4e38, 0.5, 1.0, 3.0]
    t = torch.tensor(base + [-v for v in base])
    up, down = torch.nextafter(t, torch.tensor(float("inf"))), torch.nextafter(t, torch.tensor(float("-inf")))
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan")])
    vals = torch.cat([t, up, down, special])
    g = torch.Generator().manual_seed(13)
    return vals[torch.randint(len(vals), (4099,), generator=g)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_edge_values_every_build(spyre_target, dtype):
    # Twice: a df16 value past float16's range (65504 -> 65536) is inf as float16,
    # which the upload holds as df16's NaN.
    x = _device_values(_device_values(_edge_values(), dtype).float(), dtype)
    y = _device_values(_device_values(_edge_values().flip(0), dtype).float(), dtype)
    x32, y32 = x.float(), y.float()
    want = _hold(_hold(torch.sigmoid(x32), dtype) + _hold(torch.nn.functional.silu(y32), dtype), dtype)
    for off in BUILDS:
        with cpu_features_off(*off):
            got = (torch.sigmoid(x.to("tpu")) + torch.nn.functional.silu(y.to("tpu"))).cpu()
            assert _bits_equal(got, want.to(dtype)) == 0, off
            got = _chain11(x.to("tpu"), y.to("tpu")).cpu()
            assert _bits_equal(got, _chain11_ref(x32, y32, dtype)) == 0, off
