"""Values that live only between a flush's regions (made by the flush, observed by
nothing after it) are held in flush-local memory freed after their last region
(jit.cpp, run_graph; host_runtime.h, set_transient). These programs cross regions
with such values, and with values the flush did not make, and compare with CPU."""

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="flush memory is the tpu device's")

A = cpu_randn(64, 48, seed=21)
B = cpu_randn(48, 32, seed=22)


def test_dead_intermediates_across_matmul_regions():
    def prog(a, b):
        h = (a @ b).relu()  # region 1 (matmul + epilogue), h dies below
        g = (h @ b.t()).tanh()  # region 2 reads h
        return (g * a).sum(dim=1)  # region 3 reads g

    got = prog(A.to("tpu"), B.to("tpu"))
    torch.testing.assert_close(got.cpu(), prog(A, B))


def test_value_from_an_earlier_flush_whose_tensor_died_is_read_from_its_buffer():
    x = A.to("tpu") * 2.0
    x.cpu()  # x is computed and stored by this flush
    y = (x @ B.to("tpu")).exp()  # pending: reads x
    del x  # only the pending node keeps x's storage
    torch.testing.assert_close(y.cpu(), ((A * 2.0) @ B).exp())


def test_partly_written_dead_storage_keeps_its_other_elements():
    def prog(dev):
        z = torch.zeros(8, 6, device=dev)
        z[2:5] += cpu_randn(3, 6, seed=23).to(dev)  # an in-place write through a view
        w = (z @ cpu_randn(6, 4, seed=24).to(dev)).sum(0)
        del z
        return w

    torch.testing.assert_close(prog("tpu").cpu(), prog("cpu"), rtol=0, atol=0)


def test_observed_intermediate_is_stored():
    a, b = A.to("tpu"), B.to("tpu")
    h = a @ b  # kept by the user: written to its device buffer
    out = (h * 3.0).sum()
    torch.testing.assert_close(out.cpu(), (A @ B * 3.0).sum())
    torch.testing.assert_close(h.cpu(), A @ B)
