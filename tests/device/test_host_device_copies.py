"""H2D / D2H / device-to-device copies (BR-17).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import run_both


# ---------------------------------------------------------------------------
# H2D / D2H / device-to-device copies (BR-17)
# ---------------------------------------------------------------------------

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def _host_data(dtype):
    if dtype == torch.bool:
        return (torch.arange(24) % 3 == 0).reshape(4, 6)
    if dtype.is_floating_point:
        v = torch.tensor(
            [0.0, -0.0, 1.5, -2.25, float("inf"), -float("inf"), float("nan"), 1e-3, 65504.0, 3.0e4, -7.0, 0.1] * 2,
            dtype=torch.float64,
        )
        return v.to(dtype).reshape(4, 6)
    info = torch.iinfo(dtype)
    v = torch.tensor([info.min, info.max, 0, 1, -1 if info.min < 0 else 2, 7] * 4, dtype=torch.int64)
    return v.to(dtype).reshape(4, 6)


HOST_LAYOUTS = {
    "contiguous": lambda t: t,
    "zero_dim": lambda t: t[1, 2],
    "zero_dim_offset_view": lambda t: t.view(-1)[17],
    "empty_1d": lambda t: t[:, :0].reshape(0),
    "empty_2d": lambda t: t[:3, :0],
    "transposed": lambda t: t.t(),
    "stepped": lambda t: t[1::2, ::3],
    "offset_narrow": lambda t: t.narrow(1, 2, 3),
    "transposed_sliced": lambda t: t.t()[1:],
    "expanded": lambda t: t[:, :1].expand(4, 5),
    "diagonal": lambda t: t.diagonal(1),
}


def _same_bits(a, b):
    """Bitwise equality for floating tensors (catches lost -0.0, NaN payloads, flushed subnormals)."""
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(int_type), b.contiguous().view(int_type))


@pytest.mark.parametrize("layout", sorted(HOST_LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_h2d_d2h_round_trip(dev, dtype, layout):
    src = HOST_LAYOUTS[layout](_host_data(dtype))
    # to(copy=True) gives the strides preserve_format picks; the device copy must match.
    run_both(lambda d: src.to(d, copy=True), dev, check_stride=True)
    back = src.to(dev).cpu()
    assert back.dtype == src.dtype and back.shape == src.shape
    if dtype.is_floating_point:
        assert _same_bits(back, src)  # NaN, -0.0 and rounding-free transfer
    else:
        assert torch.equal(back, src)


def test_h2d_subnormals_preserved(dev):
    src = torch.tensor([1e-40, -1e-42, 1.0e-45], dtype=torch.float32)
    assert _same_bits(src.to(dev).cpu(), src)
    half = torch.tensor([6e-8, -3e-6], dtype=torch.float16)
    assert _same_bits(half.to(dev).cpu(), half)


D2H_VIEWS = {
    "transposed": lambda x: x.t(),
    "stepped": lambda x: x[:, ::2],
    "row_offset": lambda x: x[2],
    "zero_dim": lambda x: x[1, 3],
    "expanded": lambda x: x[:1].expand(3, 4),
    "diagonal": lambda x: x.diagonal(),
    "unfold_overlapping": lambda x: x.view(-1).unfold(0, 4, 3),
}


@pytest.mark.parametrize("view", sorted(D2H_VIEWS))
def test_d2h_of_device_views(dev, view):
    host = torch.arange(12.0).reshape(3, 4)
    x = host.clone().to(dev)  # clone: on CPU .to() would alias host
    x.mul_(2)  # pending write the read must observe
    got = D2H_VIEWS[view](x).cpu()
    want = D2H_VIEWS[view](host * 2)
    assert got.shape == want.shape and torch.equal(got, want)
    # The host copy gets the layout preserve_format picks for the source view, as on CPU.
    want_copy = D2H_VIEWS[view](host * 2).to("cpu", copy=True)
    got_copy = D2H_VIEWS[view](host.to(dev) * 2).to("cpu", copy=True)
    assert got_copy.device.type == "cpu" and got_copy.stride() == want_copy.stride()
    assert torch.equal(got_copy, want_copy)


def test_d2h_via_copy_into_cpu_destination(dev):
    def prog(d):
        src = torch.arange(6, dtype=torch.int32, device=d).reshape(2, 3)
        dst = torch.zeros(3, 3, dtype=torch.float64)  # always a CPU destination
        dst[:2].copy_(src)
        dst[2].copy_(src[1] * 0.5)  # broadcasting not needed; dtype conversion is
        dst2 = torch.zeros(2, 2, 3)
        dst2.copy_(src)  # broadcast over the leading dim
        return dst, dst2

    # Results live on CPU in both runs; compare values only.
    exp = [t.clone() for t in prog("cpu")]
    act = prog(dev)
    for e, a in zip(exp, act):
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, e)


COPY_CASES = {
    "broadcast_row": (lambda d: torch.zeros(3, 4, device=d), lambda d: torch.arange(4.0).to(d)),
    "broadcast_col": (lambda d: torch.zeros(3, 4, device=d), lambda d: torch.arange(3.0).to(d).unsqueeze(1)),
    "broadcast_0dim": (lambda d: torch.zeros(2, 3, device=d), lambda d: torch.tensor(7.5).to(d)),
    "float_to_int_truncates": (
        lambda d: torch.zeros(4, dtype=torch.int64, device=d),
        lambda d: torch.tensor([-1.7, 2.5, -0.5, 300.0]).to(d),
    ),
    "float_to_bool": (
        lambda d: torch.zeros(4, dtype=torch.bool, device=d),
        lambda d: torch.tensor([0.0, -0.0, 0.1, float("nan")]).to(d),
    ),
    "bool_to_float": (lambda d: torch.zeros(3, device=d), lambda d: torch.tensor([True, False, True]).to(d)),
    "int_to_half_rounds": (
        lambda d: torch.zeros(4, dtype=torch.float16, device=d),
        lambda d: torch.tensor([2049, 4097, 65519, -3]).to(d),
    ),
    "f32_to_bf16_ties_even": (
        lambda d: torch.zeros(4, dtype=torch.bfloat16, device=d),
        lambda d: torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38]).to(d),
    ),
    "f64_to_f32": (
        lambda d: torch.zeros(3, device=d),
        lambda d: torch.tensor([1 / 3, 1e-300, 1e300], dtype=torch.float64).to(d),
    ),
    "bf16_to_f16": (
        lambda d: torch.zeros(3, dtype=torch.float16, device=d),
        lambda d: torch.tensor([1.5, 1e5, 3e-8], dtype=torch.bfloat16).to(d),
    ),
    "int64_to_int8_wraps": (
        lambda d: torch.zeros(3, dtype=torch.int8, device=d),
        lambda d: torch.tensor([300, -129, 127]).to(d),
    ),
    "noncontig_to_noncontig": (
        lambda d: torch.zeros(4, 6, device=d)[::2, 1::2],
        lambda d: torch.arange(20.0, device=d).reshape(5, 4).t()[1:3, ::2],
    ),
    "transposed_into_contig": (
        lambda d: torch.zeros(3, 2, device=d),
        lambda d: torch.arange(6.0, device=d).reshape(2, 3).t(),
    ),
    "from_cpu_broadcast_convert": (
        lambda d: torch.zeros(2, 3, dtype=torch.float16, device=d),
        lambda d: torch.tensor([1, 2, 3], dtype=torch.int32),
    ),
}


@pytest.mark.parametrize("case", sorted(COPY_CASES))
def test_device_copy_broadcast_and_convert(dev, case):
    make_dst, make_src = COPY_CASES[case]

    def prog(d):
        dst = make_dst(d)
        r = dst.copy_(make_src(d))
        assert r is dst
        return dst

    run_both(prog, dev)


def test_copy_non_blocking_then_read(dev):
    def prog(d):
        dst = torch.zeros(5, device=d)
        dst.copy_(torch.arange(5.0), non_blocking=True)
        src = torch.arange(5.0).to(d, non_blocking=True)
        return dst + src

    run_both(prog, dev)


CONVERSIONS = {
    "to_half": lambda x: x.half(),
    "to_bf16": lambda x: x.bfloat16(),
    "to_double": lambda x: x.double(),
    "to_int32": lambda x: x.to(torch.int32),
    "to_bool": lambda x: x.bool(),
    "to_uint8": lambda x: x.abs().to(torch.uint8),
    "type_int16": lambda x: x.type(torch.int16),
}


@pytest.mark.parametrize("conv", sorted(CONVERSIONS))
def test_dtype_conversion_on_device(dev, conv):
    host = torch.tensor([[-2.5, -1.5, -0.5, 0.0], [0.5, 1.5, 2.5, 100.7]])
    run_both(lambda d: CONVERSIONS[conv](host.to(d).t()[1:]), dev, check_stride=True)


FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_int": lambda d: torch.ones(3, dtype=torch.int32, device=d),
    "full_int_infers_int64": lambda d: torch.full((2,), 3, device=d),
    "full_bool": lambda d: torch.full((2,), True, device=d),
    "arange_float_step": lambda d: torch.arange(0, 1, 0.1, device=d),
    "arange_int": lambda d: torch.arange(-3, 10, 4, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "eye": lambda d: torch.eye(3, 4, device=d),
    "tensor_list": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "tensor_scalar": lambda d: torch.tensor(3.5, device=d),
    "zeros_like_transposed": lambda d: torch.zeros_like(torch.ones(2, 3, device=d).t()),
    "full_like_stepped": lambda d: torch.full_like(torch.ones(2, 6, device=d)[:, ::2], 4),
}


@pytest.mark.parametrize("case", sorted(FACTORIES))
def test_factories_match_cpu(dev, case):
    run_both(FACTORIES[case], dev, check_stride=True)


# On CPU these alias the numpy buffer (keeping its strides); on another device they copy.
# Only values, dtype and shape are comparable.
FROM_NUMPY = {
    "as_tensor_numpy_strided": lambda d: torch.as_tensor(torch.arange(12).reshape(3, 4).numpy()[:, ::2], device=d),
    "from_numpy_then_to": lambda d: torch.from_numpy(torch.arange(8.0).numpy()[1::3]).to(d),
    "tensor_from_numpy_f16": lambda d: torch.tensor(torch.arange(6.0).half().numpy()[::-1].copy(), device=d),
}


@pytest.mark.parametrize("case", sorted(FROM_NUMPY))
def test_from_numpy_values(dev, case):
    want = FROM_NUMPY[case]("cpu").clone()
    got = FROM_NUMPY[case](dev)
    assert got.device.type == torch.device(dev).type and got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)
