"""Ops whose CPU kernels have float32 and float64 loops skip the dtype probe (OpTrait kFloatLoops).

On a meta-cache miss the record kernel probes CPU's kernel on twins of the arguments
for the dtype errors only CPU's kernel raises (ops/cpu_probe.h); on a training step's
first step that ran oneDNN's setup for a convolution's 1x1 twins. For the ops listed
under kFloatLoops in tools/gen_op_table.py, a call whose floating tensors are all
float32 or all float64 (int64 indices / index / target aside) is not probed.

Checked here: every listed op computes CPU's values in float32 and in float64 (CPU's
kernel has the loops the trait claims; a case per listed op, so a new entry without one
fails), such calls run no probe (metrics()["cpu_probes"]), and other dtypes still
probe and still raise CPU's error at the call.
"""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager as tte
from difftest import DEVICE, cpu_randn, run_both

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the record kernel is the tpu device's")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import gen_op_table  # noqa: E402


def _float_loop_bases():
    for trait, bases, _ in gen_op_table.OP_TRAITS:
        if trait == "kFloatLoops":
            return set(bases) | {"convolution", "convolution_backward"}  # device_kernels.cpp's entries
    raise AssertionError("no kFloatLoops row in tools/gen_op_table.py OP_TRAITS")


def _r(*shape, seed, dtype):
    return cpu_randn(*shape, seed=seed, dtype=dtype)


# One call per listed op: fn(dev, dtype, n) with n a size of the case's own (a fresh
# meta-cache key, so the record kernel infers and would probe).
CASES = {
    "add": lambda d, t, n: torch.add(_r(n, 3, seed=1, dtype=t).to(d), _r(n, 3, seed=2, dtype=t).to(d), alpha=2),
    "add_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).add_(_r(n, 3, seed=2, dtype=t).to(d)),
    "sub": lambda d, t, n: torch.sub(_r(n, 3, seed=1, dtype=t).to(d), _r(n, 3, seed=2, dtype=t).to(d)),
    "sub_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).sub_(_r(n, 3, seed=2, dtype=t).to(d)),
    "mul": lambda d, t, n: torch.mul(_r(n, 3, seed=1, dtype=t).to(d), _r(n, 3, seed=2, dtype=t).to(d)),
    "mul_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).mul_(_r(n, 3, seed=2, dtype=t).to(d)),
    "div": lambda d, t, n: torch.div(_r(n, 3, seed=1, dtype=t).to(d), _r(n, 3, seed=2, dtype=t).to(d)),
    "div_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).div_(_r(n, 3, seed=2, dtype=t).to(d)),
    "neg": lambda d, t, n: torch.neg(_r(n, 3, seed=1, dtype=t).to(d)),
    "exp": lambda d, t, n: torch.exp(_r(n, 3, seed=1, dtype=t).to(d)),
    "sqrt": lambda d, t, n: torch.sqrt(_r(n, 3, seed=1, dtype=t).abs().to(d)),
    "reciprocal": lambda d, t, n: torch.reciprocal(_r(n, 3, seed=1, dtype=t).to(d)),
    "addcmul_": lambda d, t, n: (
        _r(n, 3, seed=1, dtype=t)
        .to(d)
        .addcmul_(_r(n, 3, seed=2, dtype=t).to(d), _r(n, 3, seed=3, dtype=t).to(d), value=0.5)
    ),
    "addcdiv_": lambda d, t, n: (
        _r(n, 3, seed=1, dtype=t)
        .to(d)
        .addcdiv_(_r(n, 3, seed=2, dtype=t).to(d), _r(n, 3, seed=3, dtype=t).abs().add(1).to(d), value=0.5)
    ),
    "lerp_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).lerp_(_r(n, 3, seed=2, dtype=t).to(d), 0.25),
    "zero_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).zero_(),
    "fill_": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).fill_(1.5),
    "clone": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).t().clone(),
    "sum": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).sum(0),
    "mean": lambda d, t, n: _r(n, 3, seed=1, dtype=t).to(d).mean(1),
    "mm": lambda d, t, n: torch.mm(_r(n, 3, seed=1, dtype=t).to(d), _r(3, 4, seed=2, dtype=t).to(d)),
    "addmm": lambda d, t, n: torch.addmm(
        _r(4, seed=3, dtype=t).to(d), _r(n, 3, seed=1, dtype=t).to(d), _r(3, 4, seed=2, dtype=t).to(d)
    ),
    "bmm": lambda d, t, n: torch.bmm(_r(2, n, 3, seed=1, dtype=t).to(d), _r(2, 3, 4, seed=2, dtype=t).to(d)),
    "cat": lambda d, t, n: torch.cat([_r(n, 3, seed=1, dtype=t).to(d), _r(2, 3, seed=2, dtype=t).to(d)]),
    "clamp": lambda d, t, n: torch.clamp(_r(n, 3, seed=1, dtype=t).to(d), -0.5, 0.5),
    "relu": lambda d, t, n: torch.relu(_r(n, 3, seed=1, dtype=t).to(d)),
    "gelu": lambda d, t, n: F.gelu(_r(n, 3, seed=1, dtype=t).to(d)),
    "gelu_backward": lambda d, t, n: torch.ops.aten.gelu_backward(
        _r(n, 3, seed=2, dtype=t).to(d), _r(n, 3, seed=1, dtype=t).to(d)
    ),
    "threshold_backward": lambda d, t, n: torch.ops.aten.threshold_backward(
        _r(n, 3, seed=2, dtype=t).to(d), _r(n, 3, seed=1, dtype=t).to(d), 0.0
    ),
    "_log_softmax": lambda d, t, n: torch._log_softmax(_r(n, 5, seed=1, dtype=t).to(d), 1, False),
    "_log_softmax_backward_data": lambda d, t, n: torch._log_softmax_backward_data(
        _r(n, 5, seed=2, dtype=t).to(d), torch.log_softmax(_r(n, 5, seed=1, dtype=t), 1).to(d), 1, t
    ),
    "_softmax": lambda d, t, n: torch._softmax(_r(n, 5, seed=1, dtype=t).to(d), 1, False),
    "_softmax_backward_data": lambda d, t, n: torch._softmax_backward_data(
        _r(n, 5, seed=2, dtype=t).to(d), torch.softmax(_r(n, 5, seed=1, dtype=t), 1).to(d), 1, t
    ),
    "nll_loss_forward": lambda d, t, n: torch.ops.aten.nll_loss_forward(
        torch.log_softmax(_r(n, 5, seed=1, dtype=t), 1).to(d), torch.arange(n).remainder(5).to(d), None, 1, -100
    ),
    "nll_loss_backward": lambda d, t, n: torch.ops.aten.nll_loss_backward(
        torch.tensor(1.0, dtype=t).to(d),
        torch.log_softmax(_r(n, 5, seed=1, dtype=t), 1).to(d),
        torch.arange(n).remainder(5).to(d),
        None,
        1,
        -100,
        torch.tensor(float(n), dtype=t).to(d),
    ),
    "max_pool2d_with_indices": lambda d, t, n: torch.ops.aten.max_pool2d_with_indices(
        _r(2, 3, 2 * n, 4, seed=1, dtype=t).to(d), [2, 2]
    ),
    "max_pool2d_with_indices_backward": lambda d, t, n: torch.ops.aten.max_pool2d_with_indices_backward(
        _r(2, 3, n, 2, seed=2, dtype=t).to(d),
        _r(2, 3, 2 * n, 4, seed=1, dtype=t).to(d),
        [2, 2],
        [2, 2],
        [0, 0],
        [1, 1],
        False,
        torch.ops.aten.max_pool2d_with_indices(_r(2, 3, 2 * n, 4, seed=1, dtype=t), [2, 2])[1].to(d),
    ),
    "linalg_vector_norm": lambda d, t, n: torch.linalg.vector_norm(_r(n, 3, seed=1, dtype=t).to(d)),
    "embedding_dense_backward": lambda d, t, n: torch.ops.aten.embedding_dense_backward(
        _r(n, 3, seed=1, dtype=t).to(d), torch.arange(n).remainder(4).to(d), 4, -1, False
    ),
    "index_select": lambda d, t, n: torch.index_select(
        _r(n, 3, seed=1, dtype=t).to(d), 0, torch.arange(n).flip(0).to(d)
    ),
    "_scaled_dot_product_flash_attention_for_cpu": lambda d, t, n: (
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _r(1, 2, n, 4, seed=1, dtype=t).to(d),
            _r(1, 2, n, 4, seed=2, dtype=t).to(d),
            _r(1, 2, n, 4, seed=3, dtype=t).to(d),
        )[0]
    ),
    "_scaled_dot_product_flash_attention_for_cpu_backward": lambda d, t, n: _sdpa_backward(d, t, n),
    "convolution": lambda d, t, n: F.conv2d(
        _r(2, 3, n, 5, seed=1, dtype=t).to(d), _r(4, 3, 3, 3, seed=2, dtype=t).to(d)
    ),
    "convolution_backward": lambda d, t, n: torch.ops.aten.convolution_backward(
        _r(2, 4, n - 2, 3, seed=3, dtype=t).to(d),
        _r(2, 3, n, 5, seed=1, dtype=t).to(d),
        _r(4, 3, 3, 3, seed=2, dtype=t).to(d),
        [4],
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        [True, True, True],
    ),
}


def _sdpa_backward(d, t, n):
    q, k, v = (_r(1, 2, n, 4, seed=s, dtype=t) for s in (1, 2, 3))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    g = _r(1, 2, n, 4, seed=4, dtype=t)
    args = [x.to(d) for x in (g, q, k, v, out, lse)]
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(*args, 0.0, False)


def test_every_listed_op_has_a_case():
    assert set(CASES) == _float_loop_bases()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_float_calls_compute_cpu_values_without_a_probe(name, dtype):
    n = 7 + sorted(CASES).index(name) + (40 if dtype == torch.float64 else 0)  # shapes of this test's own
    fn = CASES[name]
    tte.synchronize()
    before = tte.metrics()["cpu_probes"]
    run_both(lambda dev: fn(dev, dtype, n), DEVICE)
    assert tte.metrics()["cpu_probes"] == before, f"{name} ({dtype}) was probed"


def test_other_dtypes_are_still_probed():
    # float16 operands: outside the trait's dtypes, so the probe runs as before. (Verdicts
    # are kept per op, dtype and rank: a rank no other test uses, so this call is a miss.)
    a = cpu_randn(1, 2, 1, 3, 1, 2, 1, 5, seed=1, dtype=torch.float16)
    b = cpu_randn(1, 2, 1, 3, 1, 2, 1, 5, seed=2, dtype=torch.float16)
    before = tte.metrics()["cpu_probes"]
    run_both(lambda dev: torch.add(a.to(dev), b.to(dev)), DEVICE)
    assert tte.metrics()["cpu_probes"] > before


def test_a_float32_float64_mix_is_still_probed():
    a, b = cpu_randn(1, 3, 1, 2, 1, 2, 1, seed=1), cpu_randn(1, 3, 1, 2, 1, 2, 1, seed=2, dtype=torch.float64)
    before = tte.metrics()["cpu_probes"]
    run_both(lambda dev: torch.mul(a.to(dev), b.to(dev)), DEVICE)
    assert tte.metrics()["cpu_probes"] > before


def test_a_dtype_cpu_rejects_still_raises_at_the_call():
    # bitwise_and carries no kFloatLoops: CPU's "not implemented for 'Float'" at the call.
    x = torch.ones(3, 17, device=DEVICE)
    with pytest.raises(NotImplementedError):
        torch.bitwise_and(x, x)
