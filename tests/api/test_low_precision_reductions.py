"""Bf16 / fp16 reductions accumulate wider than the storage type (BR-31).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch
import torch.nn.functional as F

from difftest import cpu_randn, run_both


# ---------------------------------------------------------------------------
# bf16 / fp16 reductions accumulate wider than the storage type (BR-31)
# ---------------------------------------------------------------------------

LOWP = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_lowp_sum_of_ones_exact(dev, dtype):
    def prog(d):
        x = torch.ones(3000, dtype=dtype).to(d)
        y = torch.ones(6, 600, dtype=dtype).to(d)
        return (
            x.sum(),
            x.mean(),
            y.sum(1),
            y.t().sum(0),
            y.sum(dtype=torch.float32),
            x.cumsum(0)[-1],
            x[::2].sum(),
            y.mean(1, keepdim=True),
            x.view(3, 1000).sum(1),
        )

    run_both(prog, dev, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_lowp_reductions_of_random_data(dev, dtype):
    host = (cpu_randn(4, 1000, seed=3).abs() + 0.5).to(dtype)

    def prog(d):
        x = host.to(d)
        return (
            x.sum(),
            x.sum(1),
            x.mean(1),
            x.var(1),
            x.std(),
            torch.softmax(x, 1),
            torch.log_softmax(x, 1),
            torch.cumsum(x, 1),
            x.norm(dim=1),
            torch.logsumexp(x, 1),
            (x @ x.t()),
            F.layer_norm(x, (1000,)),
        )

    # Tolerances of the storage type: a bf16/fp16 accumulator would be off by far more.
    run_both(prog, dev, rtol=2e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-2)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_lowp_softmax_uniform_exact(dev, dtype):
    def prog(d):
        z = torch.zeros(3, 1024, dtype=dtype).to(d)
        return torch.softmax(z, -1), torch.log_softmax(z, -1), torch.softmax(z.t(), 0)

    run_both(prog, dev, rtol=0, atol=0)


def test_lowp_sum_grows_past_storage_precision(dev):
    # Each partial sum past 256 (bf16) / 2048 (fp16) is not representable exactly; a
    # narrow accumulator stalls there.
    for dtype, n, limit in ((torch.bfloat16, 4096, 256), (torch.float16, 8192, 2048)):
        s = torch.ones(n, dtype=dtype).to(dev).sum().item()
        assert s == float(n) and s > limit
