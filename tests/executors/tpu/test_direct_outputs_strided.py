"""Ops whose out= kernel is their functional kernel (mm, addmm, bmm, baddbmm, cat) and
clone write their device buffers directly even when their operands are strided
(transposed, sliced, expanded), as autograd's matmul backward and .contiguous() produce:
no temporary result copied into the buffer afterwards (region_runner.cpp,
direct_outputs; direct_kernels.h, takes_strided_inputs). Values, sizes and strides
equal CPU's."""

import pytest
import torch

from difftest import DEVICE, aten_ops_during, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="direct outputs are the tpu executor's")

A = cpu_randn(6, 4, seed=1)
B = cpu_randn(6, 5, seed=2)
C = cpu_randn(3, 4, 6, seed=3)
BIAS = cpu_randn(5, seed=4)

CASES = {
    "mm_transposed": lambda d: torch.mm(A.to(d).t(), B.to(d)),
    "mm_sliced": lambda d: torch.mm(A.to(d)[::2], B.to(d)[:4]),
    "addmm_transposed": lambda d: torch.addmm(BIAS.to(d), A.to(d).t(), B.to(d)),
    "bmm_transposed": lambda d: torch.bmm(C.to(d), C.to(d).transpose(1, 2)),
    "baddbmm_expanded": lambda d: torch.baddbmm(
        BIAS.to(d)[:4].view(1, 1, 4).expand(3, 4, 4),
        C.to(d)[:, :, :4],
        C.to(d)[:, :, 2:].transpose(1, 2),
        beta=0.5,
        alpha=2.0,
    ),
    "cat_transposed": lambda d: torch.cat([A.to(d).t(), B.to(d).t()], dim=0),
    "clone_transposed": lambda d: A.to(d).t().contiguous(),
    "clone_sliced_channels_last": lambda d: C.to(d).unsqueeze(0)[:, :, 1:].clone(memory_format=torch.channels_last),
}


def _copies(fn):
    """aten::copy_ calls while fn runs."""
    return aten_ops_during(fn).count("aten::copy_")


@pytest.mark.parametrize("name", sorted(CASES))
def test_strided_operands_equal_cpu(name):
    want = CASES[name]("cpu")
    got = CASES[name]("tpu")
    got_cpu = got.cpu()
    assert torch.equal(got_cpu, want)
    assert got.shape == want.shape and got.stride() == want.stride()


@pytest.mark.parametrize(
    "name", ["mm_transposed", "addmm_transposed", "bmm_transposed", "cat_transposed", "clone_transposed"]
)
def test_result_is_written_once(name):
    # The flush copies no more than CPU's kernel does itself (clone's copy, addmm's
    # copy of the bias into its output): no temporary result copied into the buffer.
    torch.tpu.synchronize()
    out = CASES[name]("tpu")
    assert _copies(torch.tpu.synchronize) == _copies(lambda: CASES[name]("cpu"))
    assert torch.equal(out.cpu(), CASES[name]("cpu"))
