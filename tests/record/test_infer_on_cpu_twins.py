"""Shape inference of kInferOnCpu ops (the foreach ops, ``stack``) by CPU's kernel on
zero-filled CPU twins (csrc/ops/record.cpp, ``cpu_twins``): the twins are slices of one
memory kept per recording thread and reused by the next first call, one slice per "tpu"
storage. What must hold whatever the slices: views of one storage stay views of one
twin storage (CPU's overlap checks and in-place order see CPU's aliasing), a call that
CPU rejects raises CPU's error at the call, and calls after it (larger, smaller, from
another thread) infer and compute as CPU does. Every value is compared with CPU's."""

import pytest
import torch

from difftest import DEVICE
from threaded import run_threads

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu record kernel's shape inference")


def _pair(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, x.to(DEVICE)


def _close(dev_tensors, cpu_tensors):
    for d, c in zip(dev_tensors, cpu_tensors):
        torch.testing.assert_close(d.cpu(), c, rtol=0, atol=0)


def test_views_of_one_storage_share_one_twin():
    # The rows of one tensor in two lists: CPU's slow loop writes row 0, then reads it.
    a_cpu, a_dev = _pair((2, 37), seed=1)
    torch._foreach_add_([a_cpu[0], a_cpu[1]], [a_cpu[1], a_cpu[0]])
    torch._foreach_add_([a_dev[0], a_dev[1]], [a_dev[1], a_dev[0]])
    _close([a_dev], [a_cpu])


def test_overlapping_write_raises_cpus_error_then_later_calls_infer():
    b_cpu, b_dev = _pair((41,), seed=2)
    with pytest.raises(RuntimeError) as cpu_err:
        torch._foreach_mul_([b_cpu.expand(3, 41)], 2.0)
    with pytest.raises(RuntimeError) as dev_err:
        torch._foreach_mul_([b_dev.expand(3, 41)], 2.0)
    assert str(dev_err.value) == str(cpu_err.value)
    # The next first calls (new shapes) infer on the same thread's twin memory.
    x_cpu, x_dev = _pair((43, 29), seed=3)
    y_cpu, y_dev = _pair((43, 29), seed=4)
    torch._foreach_lerp_([x_cpu, b_cpu], [y_cpu, b_cpu * 3], 0.25)
    torch._foreach_lerp_([x_dev, b_dev], [y_dev, b_dev * 3], 0.25)
    _close([x_dev, b_dev], [x_cpu, b_cpu])


def test_list_length_error_at_the_call():
    a_cpu, a_dev = _pair((47,), seed=5)
    with pytest.raises(RuntimeError) as cpu_err:
        torch._foreach_addcmul_([a_cpu], [a_cpu, a_cpu], [a_cpu], 0.5)
    with pytest.raises(RuntimeError) as dev_err:
        torch._foreach_addcmul_([a_dev], [a_dev, a_dev], [a_dev], 0.5)
    assert str(dev_err.value) == str(cpu_err.value)


def test_first_calls_of_growing_then_shrinking_size_equal_cpu(cpu_math):
    # cpu_math (conftest): sqrt with CPU's routine, so the values are bit-equal.
    # Each call's twins take more (then less) of the kept memory than the one before.
    for i, rows in enumerate((3, 700, 1500, 5, 900)):
        p_cpu, p_dev = _pair((rows, 53), seed=10 + i)
        m_cpu, m_dev = _pair((rows, 53), seed=20 + i)
        v_cpu, v_dev = _pair((rows, 53), seed=30 + i)
        v_cpu, v_dev = v_cpu.abs(), v_dev.abs()
        torch._foreach_addcdiv_([p_cpu], [m_cpu], torch._foreach_sqrt([v_cpu]), [-1e-3])
        torch._foreach_addcdiv_([p_dev], [m_dev], torch._foreach_sqrt([v_dev]), [-1e-3])
        s_cpu = torch.stack([p_cpu, m_cpu], dim=1)
        s_dev = torch.stack([p_dev, m_dev], dim=1)
        assert s_dev.stride() == s_cpu.stride()
        _close([p_dev, s_dev], [p_cpu, s_cpu])


def test_other_threads_infer_their_own_first_calls():
    results = {}

    def work(k):
        a_cpu, a_dev = _pair((700 + k, 53), seed=40 + k)
        g_cpu, g_dev = _pair((700 + k, 53), seed=50 + k)
        torch._foreach_lerp_([a_cpu], [g_cpu], 0.5)
        torch._foreach_lerp_([a_dev], [g_dev], 0.5)
        results[k] = (a_dev.cpu(), a_cpu)

    run_threads(work, [(k,) for k in range(3)])
    for dev, cpu in results.values():
        torch.testing.assert_close(dev, cpu, rtol=0, atol=0)
