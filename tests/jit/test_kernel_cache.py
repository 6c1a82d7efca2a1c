"""The JIT's kernel cache (jit/jit.cpp) and the compile / run split (issue 18, item 3).

A region is compiled once into a Kernel (Executor::compile: the fused loop programs, the
tiling plan); a cache hit only binds this flush's buffers and runtime scalars and runs.
``plans_built`` counts every plan a kernel builds (compiles plus re-plans for a new exact
layout): it must stay flat over the warm steps of a training loop. The cache is keyed by
the region's structure with full equality (not a hash alone) and bounded (LRU).
Values are compared with CPU PyTorch."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the kernel cache exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager as tte


def _mlp_step(device, steps, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [
        (torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device))
        for _ in range(2)
    ]
    losses = []
    for i in range(steps):
        x, y = batches[i % 2]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_warm_training_steps_build_no_plans():
    # Adam's step size changes every step (a runtime scalar): still no new plan.
    _mlp_step("tpu", 4)  # warm: compiles every region kind of the loop
    tte.reset_metrics()
    _mlp_step("tpu", 4)
    m = tte.metrics()
    assert m["regions_run"] > 0 and m["cache_hits"] == m["regions_run"], m
    assert m["plans_built"] == 0 and m["compiles"] == 0, m


def test_training_with_cache_hits_equals_cpu():
    losses_t, params_t = _mlp_step("tpu", 5)
    losses_c, params_c = _mlp_step("cpu", 5)
    torch.testing.assert_close(losses_t, losses_c)
    for a, b in zip(params_t, params_c):
        torch.testing.assert_close(a, b)


def test_runtime_scalars_are_rebound_on_a_hit():
    x_c = torch.randn(64, 33)
    x = x_c.to("tpu")
    for s in (0.5, -3.25, 7.0, 0.0):  # one kernel, a new constant each run
        torch.testing.assert_close((x * s + 1).sub(x, alpha=s).cpu(), (x_c * s + 1).sub(x_c, alpha=s), rtol=0, atol=0)


def test_lerp_weight_across_its_branch_point():
    # CPU's lerp uses another formula for |w| >= 0.5: a plan guarded on the branch.
    a_c, b_c = torch.randn(100), torch.randn(100)
    a, b = a_c.to("tpu"), b_c.to("tpu")
    for w in (0.1, 0.9, 0.3, -0.7, 0.49, 0.5):
        got = (a * 1.0).lerp_(b, w).mul_(2.0).cpu()
        torch.testing.assert_close(got, (a_c * 1.0).lerp_(b_c, w).mul_(2.0), rtol=0, atol=0)


def test_zero_dim_tensor_operand_is_read_each_run():
    x_c = torch.randn(50)
    x = x_c.to("tpu")
    for v in (2.0, -1.5, 3.0):
        s_c = torch.tensor(v)
        s = s_c.to("tpu")
        torch.testing.assert_close((x * s + s).abs().cpu(), (x_c * s_c + s_c).abs(), rtol=0, atol=0)


def test_aliasing_does_not_share_a_plan():
    # x * x and x * y have equal structural keys up to aliasing: each runs its own plan.
    x_c, y_c = torch.randn(40), torch.randn(40)
    x, y = x_c.to("tpu"), y_c.to("tpu")
    for _ in range(2):
        torch.testing.assert_close((x * x + 1).cpu(), x_c * x_c + 1, rtol=0, atol=0)
        torch.testing.assert_close((x * y + 1).cpu(), x_c * y_c + 1, rtol=0, atol=0)


def test_sizes_inside_one_bucket_replan_and_stay_correct():
    for n in (33, 40, 64, 33):  # one power-of-two bucket: one kernel, plans per exact layout
        x_c = torch.randn(n)
        torch.testing.assert_close((x_c.to("tpu") * 2 + 1).abs().cpu(), (x_c * 2 + 1).abs(), rtol=0, atol=0)


def test_cache_never_passes_its_bound():
    # 30 flushes of 100 distinct regions each (tril's diagonal is structural) through a cache
    # of 64: every flush alone overflows the cache, and the bound is checked after each.
    limit, flushes, per_flush = 64, 30, 100
    total = flushes * per_flush
    before = tte.metrics()["kernel_cache_limit"]
    tte._C._set_kernel_cache_limit(limit)
    try:
        x = torch.randn(4, 4).to("tpu")
        ev0 = tte.metrics()["kernel_cache_evictions"]
        for start in range(0, total, per_flush):
            ys = [torch.tril(x, k - total // 2) for k in range(start, start + per_flush)]
            torch.tpu.synchronize()
            assert tte.metrics()["kernel_cache_size"] <= limit
            del ys
        m = tte.metrics()
        assert m["kernel_cache_size"] <= limit, m
        assert m["kernel_cache_evictions"] - ev0 >= total - limit, m
        torch.testing.assert_close(torch.tril(x, 1).cpu(), torch.tril(x.cpu(), 1))
    finally:
        tte._C._set_kernel_cache_limit(before)


def test_one_region_kind_with_several_layouts_per_step_keeps_its_plans():
    # q, k and v are slices of one tensor (other offsets): the same region kind
    # recurs with several exact layouts in one step; warm steps build no plan.
    torch.manual_seed(0)
    qkv = torch.nn.Linear(16, 48).to("tpu")
    opt = torch.optim.AdamW(qkv.parameters(), lr=1e-3)
    x = torch.randn(2, 8, 16).to("tpu")

    def step():
        q, k, v = qkv(x).split(16, dim=2)
        loss = (q.exp() * 2 + k.exp() * 2 + v.exp() * 2).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    tte.reset_metrics()
    for _ in range(3):
        step()
    m = tte.metrics()
    assert m["plans_built"] == 0 and m["compiles"] == 0, m
