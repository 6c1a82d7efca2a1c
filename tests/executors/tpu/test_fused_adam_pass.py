"""Adam's / AdamW's per-parameter update as one pass of a fused loop (fused_kernels.inc,
match_adam / adam_pass): lerp_, mul_, addcmul_, sqrt, div_, add_, addcdiv_ computed with
every intermediate in vector registers, the same operation of each op on the same operands
as their separate passes, so the values are CPU's bit for bit.

Under set_fused_math("cpu") the square root is MKL's (CPU's torch.sqrt), so the step equals
torch.optim's on CPU. Under the default fused math the loop's square root is the correctly
rounded instruction (fused_program.h, MathRoutines): the CPU reference then computes the same
update with the square root rounded correctly (float64 sqrt of the float32 value, rounded to
float32: exact, as float64 carries more than 2 * 24 + 2 bits), every other op as CPU's kernel.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from difftest import DEVICE, cpu_randn, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

# Lengths with and without a vector tail (8 and 16 floats a vector), past one tile.
SHAPES = [(1,), (7,), (17,), (5, 3), (64,), (33, 31), (256, 40)]


@pytest.fixture(params=["sleef", "cpu"])
def math(request):
    for set_ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        set_(request.param)
        yield request.param


def _sqrt(t, math):
    """CPU's torch.sqrt, or (default fused math) the correctly rounded square root."""
    return torch.sqrt(t) if math == "cpu" or t.device.type != "cpu" else t.double().sqrt().float()


def _state(seed, dtype=torch.float32, shapes=SHAPES):
    ps = [cpu_randn(*s, seed=seed + i).to(dtype) for i, s in enumerate(shapes)]
    gs = [cpu_randn(*s, seed=seed + 100 + i).to(dtype) for i, s in enumerate(shapes)]
    ms = [cpu_randn(*s, seed=seed + 200 + i).to(dtype) * 0.1 for i, s in enumerate(shapes)]
    vs = [cpu_randn(*s, seed=seed + 300 + i).to(dtype).abs() * 0.01 for i, s in enumerate(shapes)]
    return ps, gs, ms, vs


def _step(ps, gs, ms, vs, math, *, decay=None, clip=None, lerp=True, step=3):
    """torch.optim.Adam(W)'s foreach update (non-capturable), its square root as _sqrt."""
    beta1, beta2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    if clip is not None:
        torch._foreach_mul_(gs, clip)
    if decay is not None:
        torch._foreach_mul_(ps, 1 - lr * decay)
    if lerp:
        torch._foreach_lerp_(ms, gs, 1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, gs, gs, 1 - beta2)
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    denom = [_sqrt(v, math) for v in vs]
    torch._foreach_div_(denom, [bc2**0.5] * len(denom))
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(ps, ms, denom, [-lr / bc1] * len(denom))


def _run(math, **kw):
    cpu = _state(0)
    dev = [[t.to("tpu") for t in ts] for ts in cpu]
    _step(*cpu, math, **kw)
    _step(*dev, math, **kw)
    for want, got in zip(cpu, dev):
        for w, g in zip(want, got):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            assert torch.equal(g.cpu(), w), (g.cpu() - w).abs().max()


@pytest.mark.parametrize("variant", ["adam", "adamw", "adamw_clip", "no_lerp"])
def test_adam_update_one_pass_bit_equal(math, variant):
    kw = {
        "adam": {},
        "adamw": {"decay": 0.1},
        "adamw_clip": {"decay": 0.1, "clip": 0.37},
        "no_lerp": {"lerp": False},
    }[variant]
    _run(math, **kw)


def test_adam_update_with_scalar_tensor_clip(math):
    # clip_grad_norm_'s coefficient is a 0-dim tensor on the device.
    cpu = _state(7)
    dev = [[t.to("tpu") for t in ts] for ts in cpu]
    _step(*cpu, math, clip=torch.tensor(0.42), decay=0.01)
    _step(*dev, math, clip=torch.tensor(0.42).to("tpu"), decay=0.01)
    for want, got in zip(cpu, dev):
        for w, g in zip(want, got):
            assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("opt_cls,kwargs", [(torch.optim.Adam, {}), (torch.optim.AdamW, {"weight_decay": 0.1})])
@pytest.mark.parametrize("foreach_cpu", [False, True])
def test_optimizer_steps_match_cpu(opt_cls, kwargs, foreach_cpu):
    # CPU eager's single-tensor Adam (the benchmark's) and its foreach form against the
    # tpu's step (foreach: one region), three steps, bit for bit under CPU's sqrt.
    for set_ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        set_("cpu")
        shapes = [(33, 31), (31,), (256, 40), (3,)]
        params_cpu = [torch.nn.Parameter(cpu_randn(*s, seed=i)) for i, s in enumerate(shapes)]
        params_tpu = [torch.nn.Parameter(p.detach().clone().to("tpu")) for p in params_cpu]
        opt_cpu = opt_cls(params_cpu, lr=1e-2, foreach=foreach_cpu, **kwargs)
        opt_tpu = opt_cls(params_tpu, lr=1e-2, **kwargs)
        for step in range(3):
            for i, (pc, pt) in enumerate(zip(params_cpu, params_tpu)):
                g = cpu_randn(*pc.shape, seed=50 + 10 * step + i)
                pc.grad, pt.grad = g, g.to("tpu")
            opt_cpu.step()
            opt_tpu.step()
            for pc, pt in zip(params_cpu, params_tpu):
                assert torch.equal(pt.detach().cpu(), pc.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_update_matches_cpu(dtype):
    # bfloat16 / float16 state rounds each op's result to its type: not the one-pass form
    # (every instruction rounds), still CPU's values.
    for set_ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        set_("cpu")
        cpu = _state(3, dtype, shapes=[(17,), (33, 31)])
        dev = [[t.to("tpu") for t in ts] for ts in cpu]
        _step(*cpu, "cpu", decay=0.1)
        _step(*dev, "cpu", decay=0.1)
        for want, got in zip(cpu, dev):
            for w, g in zip(want, got):
                assert g.dtype == dtype
                assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_and_near_miss_programs(math, seed):
    # Random shapes; and programs that differ from the update in one op (eps added with
    # alpha, a division by a tensor bias correction) run their passes, with CPU's values.
    gen = torch.Generator().manual_seed(seed)
    shapes = [
        tuple(int(d) for d in torch.randint(1, 70, (int(torch.randint(1, 3, (1,), generator=gen)),), generator=gen))
    ]
    shapes.append((int(torch.randint(1, 5000, (1,), generator=gen)),))
    cpu = _state(20 + seed, shapes=shapes)
    dev = [[t.to("tpu") for t in ts] for ts in cpu]
    _step(*cpu, math, decay=0.05 * seed if seed else None)
    _step(*dev, math, decay=0.05 * seed if seed else None)

    def near(ps, ms, vs):
        d = [_sqrt(v, math) for v in vs]
        torch._foreach_add_(d, [torch.full_like(v, 1e-3) for v in vs], alpha=0.5)
        torch._foreach_addcdiv_(ps, ms, d, -1e-3)

    near(cpu[0], cpu[2], cpu[3])
    near(dev[0], dev[2], dev[3])
    for want, got in zip(cpu, dev):
        for w, g in zip(want, got):
            assert torch.equal(g.cpu(), w)


def test_debug_metrics_count_the_one_pass_update():
    code = textwrap.dedent("""
        import torch, torch_tpu_eager as tte
        ps = [torch.nn.Parameter(torch.randn(64, 32).to("tpu")), torch.nn.Parameter(torch.randn(9).to("tpu"))]
        opt = torch.optim.Adam(ps, lr=1e-3)
        for p in ps:
            p.grad = torch.randn(p.shape).to("tpu")
        opt.step()
        torch.tpu.synchronize()
        print(tte.metrics_report())
    """)
    env = dict(os.environ, TORCH_TPU_DEBUG="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "  fused_pass.adam_update: 2\n" in proc.stdout, proc.stdout


@pytest.mark.parametrize("opt_cls,kwargs", [(torch.optim.Adam, {}), (torch.optim.AdamW, {"weight_decay": 0.1})])
def test_weight_gradient_from_matmul_updates_in_the_adam_pass(opt_cls, kwargs):
    # Backward and the optimizer step in one flush: the weight gradient is a matmul's
    # product, and exp_avg.lerp_(grad) reads it. Partition leaves the lerp_ (an in-place
    # update of optimizer state used again later in the flush) out of the matmul's
    # epilogue, so it runs inside the multi-tensor region's one-pass update: no kernel
    # holds both the product and a lerp_, one holds every lerp_. Values equal torch.optim
    # on CPU (foreach form) bit for bit under CPU's sqrt.
    for set_ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        set_("cpu")
        torch.manual_seed(0)
        lin_cpu = torch.nn.Linear(40, 24)
        lin_tpu = torch.nn.Linear(40, 24).to("tpu")
        lin_tpu.load_state_dict(lin_cpu.state_dict())
        opt_cpu = opt_cls(lin_cpu.parameters(), lr=1e-2, foreach=True, **kwargs)
        opt_tpu = opt_cls(lin_tpu.parameters(), lr=1e-2, **kwargs)
        for step in range(3):
            x = cpu_randn(16, 40, seed=70 + step)
            for lin, opt, xs in ((lin_cpu, opt_cpu, x), (lin_tpu, opt_tpu, x.to("tpu"))):
                torch.tpu.synchronize()
                with torch_tpu_eager.profile() as prof:
                    lin(xs).square().sum().backward()
                    opt.step()
                    opt.zero_grad()
                    torch.tpu.synchronize()
            names = [k["name"] for k in prof.kernels]
            assert not any("mm" in n and "lerp" in n for n in names), names
            if step > 0:  # the first step also creates the state (zeros) in the flush
                assert sum("lerp__lerp_" in n for n in names) == 1, names
            for pc, pt in zip(lin_cpu.parameters(), lin_tpu.parameters()):
                assert torch.equal(pt.detach().cpu(), pc.detach()), (step, names)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_parameters_in_blocks_across_threads(math, threads):
    # Tensors of several 4,096-float blocks of the one-pass loop and a ragged last block,
    # split over two intra-op threads past 32,768 elements a thread: CPU's values.
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu = _state(11, shapes=[(70001,), (257, 300), (4096,), (4097,)])
        dev = [[t.to("tpu") for t in ts] for ts in cpu]
        _step(*cpu, math, decay=0.1)
        _step(*dev, math, decay=0.1)
        for want, got in zip(cpu, dev):
            for w, g in zip(want, got):
                assert torch.equal(g.cpu(), w)
    finally:
        torch.set_num_threads(previous)
