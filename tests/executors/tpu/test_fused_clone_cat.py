"""clone and the value cache's cat in fused loops (the 2-layer llama's ops
around SDPA, issue 18). A float32 ``clone`` runs as a cat of its one input
(Lowering::concat): the loop stores its input through the output's strides, so
``dk.transpose(1, 2).clone()`` (autograd's reshape of a transposed head
gradient) runs in the region that made or wrote ``dk``, in a loop of its own
after the loop that wrote ``dk`` in place. A ``cat((empty, v), -2)`` whose input
an earlier region made joins the previous elementwise region as a loop of its
own (horizontal fusion). Each case asserts values (bit for bit), dtypes, shapes
and strides against CPU, and the regions a flush runs (one more on main, where
the clone or cat ran alone in a region of its own)."""

import pytest
import torch

from difftest import DEVICE, assert_bit_equal, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")


def _run(fn, cpu_args):
    """fn on "tpu" with the region verifier on: (results on CPU, their strides, regions run)."""
    import torch_tpu_eager

    torch_tpu_eager._C._jit_set_verify(True)
    args = [a.to(DEVICE) for a in cpu_args]
    torch.tpu.synchronize()
    before = torch_tpu_eager.metrics()["regions_run"]
    out = fn(*args)
    torch.tpu.synchronize()
    regions = torch_tpu_eager.metrics()["regions_run"] - before
    return [o.cpu() for o in out], [o.stride() for o in out], regions


def _check(fn, cpu_args, regions):
    want = fn(*[a.clone() for a in cpu_args])
    got, strides, ran = _run(fn, cpu_args)
    assert_bit_equal(got, want)
    assert strides == [w.stride() for w in want], (strides, [w.stride() for w in want])
    assert ran == regions, f"{ran} regions run, expected {regions}"


def test_clone_of_transposed_heads_joins_its_producer():
    def fn(x, y):
        t = x * 2.0 + y  # (2, 2, 16, 16) row-major
        return (t.transpose(1, 2).clone(), t.transpose(1, 2).clone(memory_format=torch.contiguous_format), t)

    _check(fn, [cpu_randn(2, 2, 16, 16, seed=1), cpu_randn(2, 2, 16, 16, seed=2)], regions=1)


def test_clone_preserve_format_of_a_permuted_view():
    # memory_format=preserve keeps a dense permuted input's strides (CPU's empty_like).
    def fn(x, y):
        t = (x * y).permute(2, 0, 1)
        return (t.clone(), (t + 1.0).clone(), t.clone() * 3.0)

    _check(fn, [cpu_randn(5, 6, 7, seed=3), cpu_randn(5, 6, 7, seed=4)], regions=1)


def test_clone_reads_a_tensor_an_earlier_loop_writes_in_place():
    # autograd's accumulation into a head gradient, then its reshape's clone: the
    # clone's loop runs after the in-place loop and reads its result; a later
    # in-place write runs after the clone (a region of its own).
    def fn(dk, a, b):
        dk.add_(a).mul_(b)
        c = dk.transpose(1, 2).reshape(32, 32)
        dk.add_(1.0).mul_(0.5)
        return (c, dk)

    args = [cpu_randn(2, 2, 16, 16, seed=s) for s in (5, 6, 7)]
    _check(fn, args, regions=2)


def test_clone_reads_a_dying_product_written_in_place():
    # dk made by a matmul region, accumulated into by a later loop, read only by
    # the clone's loop: the in-place values reach the clone though dk then dies.
    def fn(x, w, a, b, y):
        dk = (x @ w).view(2, 2, 16, 16)
        e = y * 2.0 + y
        dk.add_(a).mul_(b)
        dk.add_(e)
        return (dk.transpose(1, 2).reshape(32, 32) * 1.0,)

    args = [cpu_randn(32, 32, seed=s) for s in (11, 12)] + [cpu_randn(2, 2, 16, 16, seed=s) for s in (13, 14, 15)]
    _check(fn, args, regions=2)


def test_value_cache_cat_joins_the_previous_loop_region():
    # v = (x @ w) viewed as heads (a matmul region), rotary-like elementwise ops on
    # another tensor, then the cache's cat((empty, v), -2): in the elementwise region.
    def fn(x, w, k):
        v = (x @ w).view(2, 16, 2, 16).transpose(1, 2)
        k2 = -k * 3.0 + k
        empty = torch.tensor([], device=x.device)
        return (torch.cat([empty, v], dim=-2), k2)

    _check(fn, [cpu_randn(32, 32, seed=8), cpu_randn(32, 32, seed=9), cpu_randn(2, 2, 16, 16, seed=10)], regions=2)


def test_clones_the_loop_declines_run_op_by_op():
    # bfloat16, conjugate and 0-dim clones keep CPU's kernel; values as CPU's.
    def fn(x, z, s):
        return ((x * 2).bfloat16().clone(), (z * 2).conj().clone(), (s * 2).clone())

    z = torch.complex(cpu_randn(4, 5, seed=11), cpu_randn(4, 5, seed=12))
    want = fn(cpu_randn(4, 5, seed=13), z, torch.tensor(1.5))
    got, strides, _ = _run(fn, [cpu_randn(4, 5, seed=13), z, torch.tensor(1.5)])
    assert_bit_equal(got, want)
    assert strides == [w.stride() for w in want]
