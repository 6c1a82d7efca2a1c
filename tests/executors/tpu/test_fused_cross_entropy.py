"""Cross-entropy in fused row loops (csrc/jit/partition.cpp, cross_entropy_pair;
csrc/executors/tpu/fused_cross_entropy.cpp): the forward's ``_log_softmax`` and
``nll_loss_forward`` run as one region (the row loop, then the loss from its rows), the
backward's ``nll_loss_backward`` and ``_log_softmax_backward_data`` as one row loop that
never stores the mostly-zero gradient of the log-probabilities. Losses and gradients are
compared with CPU PyTorch bit for bit (CPU's summation orders are followed); the kernel
trace shows the regions. bfloat16 / float16, label smoothing and out-of-range targets take
the existing paths and are compared the same way."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from difftest import DEVICE, cpu_randint, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

FWD = "_log_softmax_nll_loss_forward"  # the forward region's name ends so (producers come first)
# The backward's region: autograd's fill_ of the loss gradient (a reduction's seed; run op by
# op as its first loop), then the pair.
BWD = "nll_loss_backward__log_softmax_backward_data"


def _fused(kernels):
    """Whether the forward and the backward pair each ran as one region."""
    return any(k.startswith("fused_") and k.endswith(FWD) for k in kernels) and any(
        k in ("fused_" + BWD, "fused_fill__" + BWD) for k in kernels
    )


def _step(logits, target, weight=None, **kw):
    """Loss and gradient of the logits of F.cross_entropy on logits' device."""
    x = logits.detach().clone().requires_grad_()
    loss = F.cross_entropy(x * 1.0, target, weight=weight, **kw)
    grad = cpu_randn(*loss.shape, seed=9).to(loss.device) if loss.dim() else None
    loss.backward(grad)
    return loss.detach(), x.grad


LOSS_OPS = ("aten::nll_loss_forward", "aten::nll_loss_backward", "aten::_log_softmax_backward_data")


def _aten_ops_in_regions(prof):
    """The ATen ops called inside the "tpu::" region ranges (op-by-op runs)."""

    def below(ev):
        names = []
        for c in ev.cpu_children:
            names += [c.name] + below(c)
        return names

    return [n for e in prof.events() if e.name.startswith("tpu::") for n in below(e)]


def _compare(n, c, weight=False, seed=0, dtype=torch.float32, **kw):
    """Runs the step on CPU and "tpu"; returns the kernel names of the tpu step and the
    cross-entropy ATen ops that ran op by op in it."""
    x = cpu_randn(n, c, seed=seed, dtype=dtype) * 3
    t = cpu_randint(0, c, (n,), seed=seed + 1)
    if "ignore_index" in kw and n > 1:
        t[:: max(1, n // 3)] = kw["ignore_index"]
    w = cpu_randn(c, seed=seed + 2).abs().to(dtype) if weight else None
    loss_cpu, grad_cpu = _step(x, t, w, **kw)
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as aten, torch_tpu_eager.profile() as prof:
        loss, grad = _step(x.to("tpu"), t.to("tpu"), None if w is None else w.to("tpu"), **kw)
        loss, grad = loss.cpu(), grad.cpu()
    assert torch.equal(loss, loss_cpu), (loss, loss_cpu)
    assert torch.equal(grad, grad_cpu), (grad - grad_cpu).abs().max()
    return [k["name"] for k in prof.kernels], [o for o in _aten_ops_in_regions(aten) if o in LOSS_OPS]


SHAPES = [(1, 1), (1, 7), (4, 10), (33, 17), (64, 1000), (300, 65), (2048, 16)]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cross_entropy_is_two_regions_and_bit_equal(shape, reduction):
    kernels, by_ops = _compare(*shape, reduction=reduction)
    assert _fused(kernels) and not by_ops, (kernels, by_ops)
    assert not any("nll_loss" in k and not k.endswith(FWD) and not k.endswith(BWD) for k in kernels), kernels
    if reduction != "none":  # the seed gradient joins the backward's region
        assert "fused_fill__" + BWD in kernels, kernels


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
@pytest.mark.parametrize("weight", [False, True])
def test_weights_and_ignored_rows_are_bit_equal(weight, ignore_index, reduction):
    kernels, by_ops = _compare(97, 11, weight=weight, seed=4, reduction=reduction, ignore_index=ignore_index)
    assert _fused(kernels) and not by_ops, (kernels, by_ops)


def test_every_row_ignored_gives_cpu_nan_and_zero_gradient():
    x, t = cpu_randn(5, 4, seed=1), torch.full((5,), -100)
    loss_cpu, grad_cpu = _step(x, t)
    loss, grad = _step(x.to("tpu"), t.to("tpu"))
    assert torch.equal(loss.cpu().isnan(), loss_cpu.isnan()) and torch.equal(grad.cpu(), grad_cpu)


def test_nan_inf_and_zero_gradients_are_bit_equal():
    x = cpu_randn(6, 9, seed=2)
    x[1, 3], x[2, :], x[4, 0] = float("nan"), float("-inf"), float("inf")
    t = torch.tensor([3, 3, 0, 8, 0, 5])
    for scale in (1.0, 0.0, -0.0, float("inf")):
        xc = x.clone().requires_grad_()
        loss_cpu = F.cross_entropy(xc, t, reduction="sum")
        loss_cpu.backward(torch.tensor(scale))
        xt = x.to("tpu").requires_grad_()
        loss = F.cross_entropy(xt, t.to("tpu"), reduction="sum")
        loss.backward(torch.tensor(scale).to("tpu"))
        assert torch.equal(loss.detach().cpu().view(torch.int32), loss_cpu.detach().view(torch.int32))
        assert torch.equal(xt.grad.cpu().view(torch.int32), xc.grad.view(torch.int32)), scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_losses_take_the_existing_path(dtype):
    _, by_ops = _compare(16, 10, dtype=dtype)
    assert sorted(by_ops) == sorted(LOSS_OPS), by_ops


def test_label_smoothing_is_bit_equal():
    # Its extra terms read the log-probabilities: the pair still fuses where it can.
    _compare(40, 12, weight=True, label_smoothing=0.1)
    _compare(40, 12, label_smoothing=0.25, reduction="sum")


def test_out_of_range_target_raises_cpu_error_and_the_queue_stays_valid():
    x, t = cpu_randn(4, 5, seed=3), torch.tensor([0, 5, 1, 2])
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        F.cross_entropy(x, t)
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        F.cross_entropy(x.to("tpu"), t.to("tpu")).cpu()
    ok = F.cross_entropy(x.to("tpu"), torch.tensor([0, 4, 1, 2]).to("tpu"))
    assert torch.equal(ok.cpu(), F.cross_entropy(x, torch.tensor([0, 4, 1, 2])))


@pytest.mark.parametrize("threads", [1, 2])
def test_large_batch_on_threads_is_bit_equal(threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _compare(4096, 40, weight=True, seed=7)
    finally:
        torch.set_num_threads(old)


def test_producers_join_the_forward_row_loop():
    # logits / temperature runs in the forward's row loop before _log_softmax.
    x, t = cpu_randn(32, 24, seed=5), cpu_randint(0, 24, (32,), seed=6)

    def fn(x, t):
        return F.nll_loss(F.log_softmax(x / 0.7 + 1.0, -1), t)

    torch.tpu.synchronize()
    with torch_tpu_eager.profile() as prof:
        out = fn(x.to("tpu"), t.to("tpu")).cpu()
    assert torch.equal(out, fn(x, t))
    assert [k["name"] for k in prof.kernels] == ["fused_div_add__log_softmax_nll_loss_forward"], prof.kernels


def test_loss_without_grad_runs_in_the_row_loop():
    # No backward reads the log-probabilities: the loop still stores them for the loss.
    x, t = cpu_randn(50, 13, seed=8), cpu_randint(0, 13, (50,), seed=9)
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as aten, torch.no_grad():
        out = F.cross_entropy(x.to("tpu"), t.to("tpu")).cpu()
    assert torch.equal(out, F.cross_entropy(x, t))
    ops = _aten_ops_in_regions(aten)
    assert "aten::nll_loss_forward" not in ops and "aten::_log_softmax" not in ops, ops


def test_avx2_kernels_are_bit_equal_in_a_child_process(tmp_path):
    # ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) against the loop's AVX2 code.
    import os
    import subprocess
    import sys

    from difftest import REPO_ROOT

    code = (
        "import torch, torch.nn.functional as F, torch_tpu_eager\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(77, 29, generator=g) * 3; t = torch.randint(0, 29, (77,), generator=g)\n"
        "w = torch.rand(29, generator=g)\n"
        "for kw in ({}, {'weight': w}, {'reduction': 'sum', 'ignore_index': 2}):\n"
        "    xc = x.clone().requires_grad_(); lc = F.cross_entropy(xc, t, **kw); lc.backward()\n"
        "    kt = {k: (v.to('tpu') if torch.is_tensor(v) else v) for k, v in kw.items()}\n"
        "    xt = x.to('tpu').requires_grad_(); lt = F.cross_entropy(xt, t.to('tpu'), **kt); lt.backward()\n"
        "    assert torch.equal(lt.cpu(), lc) and torch.equal(xt.grad.cpu(), xc.grad), kw\n"
        "print('ok', torch.backends.cpu.get_cpu_capability())\n"
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", PYTHONPATH=str(REPO_ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok", "AVX2"], r.stdout
