"""Fused loops on edge cases: foreach optimizers not in the fused vocabulary, an add whose bool
alpha CPU rejects."""

import pytest
import torch
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


def test_foreach_asgd_matches_cpu():
    # ASGD's eta is computed by 0-dim device ops with Python scalars (the case above).
    p = [torch.nn.Parameter(torch.randn(64, generator=torch.Generator().manual_seed(0)))]
    q = [torch.nn.Parameter(p[0].detach().to("tpu"))]
    opt_cpu = torch.optim.ASGD(p, lr=1e-2, foreach=True)
    opt_tpu = torch.optim.ASGD(q, lr=1e-2, foreach=True)
    for step in range(3):
        g = torch.randn(64, generator=torch.Generator().manual_seed(step + 1))
        p[0].grad, q[0].grad = g, g.to("tpu")
        opt_cpu.step()
        opt_tpu.step()
    assert torch.equal(q[0].detach().cpu(), p[0].detach())


# Fixed in fused_elementwise.cpp: a fused loop took a bool alpha on a float add as 1,
# where CPU raises; the op now runs op by op and raises CPU's error (at the flush).
@pytest.mark.parametrize("form", ["in_place", "functional"])
def test_bool_alpha_on_float_add_raises_in_a_fused_region(form):
    a, b = torch.randn(40), torch.randn(40)
    with pytest.raises(RuntimeError, match="Boolean alpha") as cpu_err:
        torch.add(a, b, alpha=True)
    da, db = a.to("tpu"), b.to("tpu")
    with pytest.raises(type(cpu_err.value), match="Boolean alpha"):
        if form == "in_place":
            da.mul_(2.0)
            da.add_(db, alpha=True)
            da.cpu()
        else:
            (torch.add(da, db, alpha=True) * 2.0).cpu()
    assert torch.equal((db * 3.0).cpu(), b * 3.0)  # the queue and other tensors stay valid
