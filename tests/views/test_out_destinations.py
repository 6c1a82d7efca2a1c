"""Out= destinations (BR-12).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import warnings

import pytest
import torch

from difftest import run_both, run_both_outcome


# ---------------------------------------------------------------------------
# out= destinations (BR-12)
# ---------------------------------------------------------------------------

OUT_CASES = {
    "neg_into_transposed": lambda x, d: torch.neg(x, out=torch.empty(3, 3, device=d).t()),
    "add_into_stepped": lambda x, d: torch.add(x, 1, out=torch.zeros(3, 6, device=d)[:, ::2]),
    "mul_into_column_block": lambda x, d: torch.mul(x, x, out=torch.zeros(3, 5, device=d)[:, 1:4]),
    "mm_into_transposed": lambda x, d: torch.mm(x, x.t(), out=torch.empty(3, 3, device=d).t()),
    "sum_dim_into_slice": lambda x, d: torch.sum(x, 1, out=torch.zeros(6, device=d)[1::2]),
    "cumsum_into_transposed": lambda x, d: torch.cumsum(x, 0, out=torch.empty(3, 3, device=d).t()),
    "cat_into_stepped": lambda x, d: torch.cat([x, x[:1]], out=torch.zeros(8, 3, device=d)[::2]),
    "index_select_into_view": lambda x, d: torch.index_select(
        x, 1, torch.tensor([2, 0]).to(d), out=torch.zeros(3, 4, device=d)[:, 1:3]
    ),
    "where_into_transposed": lambda x, d: torch.where(x > 3, x, -x, out=torch.empty(3, 3, device=d).t()),
    "add_f32_into_f64": lambda x, d: torch.add(x, 0.25, out=torch.empty(3, 3, dtype=torch.float64, device=d)),
    "add_f32_into_f16_view": lambda x, d: torch.add(
        x, 0.1, out=torch.zeros(3, 6, dtype=torch.float16, device=d)[:, 2:5]
    ),
    "eq_into_float": lambda x, d: torch.eq(x, 4, out=torch.empty(3, 3, device=d)),
    "int_add_into_int64": lambda x, d: torch.add(
        x.to(torch.int32), 7, out=torch.empty(3, 3, dtype=torch.int64, device=d)
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_out_into_strided_destination(dev, case):
    def prog(d):
        x = torch.arange(9.0, device=d).reshape(3, 3)
        out = OUT_CASES[case](x, d)
        return out, out._base if out._base is not None else out

    run_both(prog, dev)


def test_out_returns_the_destination_and_writes_base(dev):
    def prog(d):
        z = torch.zeros(4, 4, device=d)
        dst = z[1:3, ::2]
        r = torch.add(torch.ones(2, 2, device=d), 2, out=dst)
        assert r is dst
        return z, dst

    run_both(prog, dev)


@pytest.mark.parametrize("shape", [(0,), (5,), (2, 3), (7, 1)])
def test_out_wrong_size_is_resized(dev, shape):
    def prog(d):
        out = torch.full(shape, -1.0, device=d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CPU warns when a non-empty out= is resized
            torch.add(torch.arange(4.0, device=d).reshape(2, 2), 1, out=out)
        return out

    run_both(prog, dev, check_stride=True)


def test_out_wrong_size_transposed_destination_resized(dev):
    def prog(d):
        out = torch.empty(2, 2, device=d).t()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.mul(torch.arange(6.0, device=d).reshape(2, 3), 2, out=out)
        return out

    run_both(prog, dev, check_stride=True)


OUT_DTYPE_REJECTED = {
    "add_float_into_int": lambda d: torch.add(
        torch.tensor([1]).to(d), 1.5, out=torch.empty(1, dtype=torch.long, device=d)
    ),
    "neg_float_into_int": lambda d: torch.neg(
        torch.tensor([1.0]).to(d), out=torch.empty(1, dtype=torch.long, device=d)
    ),
    "mm_into_int": lambda d: torch.mm(
        torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), out=torch.empty(2, 2, dtype=torch.long, device=d)
    ),
    "add_int_into_bool": lambda d: torch.add(
        torch.ones(2, dtype=torch.int32, device=d), 1, out=torch.empty(2, dtype=torch.bool, device=d)
    ),
    "cat_float_into_int": lambda d: torch.cat(
        [torch.ones(2, device=d)], out=torch.empty(2, dtype=torch.long, device=d)
    ),
    "inplace_int_add_float": lambda d: torch.ones(2, dtype=torch.long, device=d).add_(1.5),
    "inplace_bool_add_int": lambda d: torch.ones(2, dtype=torch.bool, device=d).add_(1),
}


@pytest.mark.parametrize("case", sorted(OUT_DTYPE_REJECTED))
def test_out_dtype_rejected_like_cpu(dev, case):
    exc = run_both_outcome(OUT_DTYPE_REJECTED[case], dev)
    assert exc is not None, "CPU is expected to reject this out= dtype"
