"""Scalar arguments on the record path (alpha, value, clamp bounds, exponents).

The unboxed record kernels put a plain int or float Scalar on the stack as the
IValue PyTorch makes of it, and a meta-cache key whose Scalars CPU converts with an
overflow check (add's alpha) and are ints or bools -- held in the key by value -- is
checked once, when the key is first inferred (MetaOutcome::scalars_fit). These tests
hold both to CPU: every call raises CPU's error at the call or gives CPU's values and
dtype, also when an earlier call with another value of the same type filled the cache,
and for every Scalar kind (int, float, bool, complex, an int beyond int64).
"""

import subprocess
import sys
import textwrap

import pytest
import torch

from difftest import PYTHON_ENV, cpu_randn, run_both, run_both_at_call


def _ints(dtype):
    return lambda d: (torch.tensor([1, 2, 3], dtype=dtype, device=d),)


# (dtype of both operands, alphas in call order): values that fit, then one that does
# not (a new key: its own check), then the fitting one again (a cached key) and the
# failing one again (its cached key must check again, not skip).
ALPHA_SEQUENCES = [
    (torch.int8, [1, 127, 300, 1, 300, -129, 2]),
    (torch.uint8, [1, -1, -255, -256, 256, -1, 1]),
    (torch.int16, [2, 70000, 2, 70000]),
    (torch.float16, [1, 65504, 70000, 1, 70000, -70000]),
    (torch.bfloat16, [1, 2**62, 1]),
    (torch.float32, [1, 2**63, 2**64 - 1, 1]),  # beyond int64: an unsigned Scalar
    (torch.bool, [True, 2, False, 1]),
    (torch.int8, [1.5, 1, 2.0]),  # a float alpha with integer inputs: CPU's alpha_check
    (torch.float32, [True, 1, 1j, 1]),  # bool alpha, complex alpha with real inputs
]


@pytest.mark.parametrize("op", [torch.add, torch.sub], ids=["add", "sub"])
@pytest.mark.parametrize(
    "dtype,alphas", ALPHA_SEQUENCES, ids=[f"{str(d)[6:]}-{i}" for i, (d, _) in enumerate(ALPHA_SEQUENCES)]
)
def test_alpha_of_every_kind_checked_at_each_call_like_cpu(dev, op, dtype, alphas):
    # (sub of bool tensors raises on CPU whatever alpha is: compared as well.)
    for alpha in alphas:
        run_both_at_call(_ints(dtype), lambda t, alpha=alpha: op(t, t, alpha=alpha), dev)


@pytest.mark.parametrize(
    "call",
    [
        lambda t, v: torch.addcmul(t, t, t, value=v),
        lambda t, v: torch.clamp(t, min=v),
        lambda t, v: torch.clamp(t, min=-v, max=v),
        lambda t, v: t.add(2, alpha=v),
        lambda t, v: torch.pow(t, v),
    ],
    ids=["addcmul_value", "clamp_min", "clamp_min_max", "add_scalar_alpha", "pow_exponent"],
)
@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.float32])
def test_int_scalars_of_other_ops_fit_or_raise_like_cpu_once_cached(dev, call, dtype):
    # 3 fits every dtype, 300 overflows int8 (not float16), 70000 overflows float16 too.
    for v in (3, 300, 3, 70000, 300, 3):
        run_both_at_call(_ints(dtype), lambda t, v=v: call(t, v), dev)


def test_scalar_kinds_on_the_unboxed_kernels_give_cpu_values_and_dtypes(dev):
    f = cpu_randn(5, seed=3)
    i = torch.arange(5, dtype=torch.int32)
    b = torch.tensor([True, False, True, False, True])

    def prog(d):
        x, n, m = f.to(d), i.to(d), b.to(d)
        return [
            x.add(x, alpha=2),
            x.add(x, alpha=-3),
            x.add(x, alpha=0.25),
            x.sub(x, alpha=2**63),
            n.add(n, alpha=3),
            n.add(2, alpha=5),  # add.Tensor with a wrapped number, int result
            n.add(2.5),  # a wrapped float promotes an int tensor to the default dtype
            n * 1.5,
            m.add(m, alpha=True),
            x.clamp(-0.5, 0.5),
            x.clamp(min=0),
            n.clamp(max=2),
            x.pow(2.0),
            n.pow(2),
            x.addcmul(x, x, value=0.5),
            x.addcdiv(x, x + 3, value=2),
            torch.ops.aten.add.Scalar(x, 2.0, 0.5),
            torch.ops.aten.mul.Scalar(n, 3),
            torch.ops.aten.mul.Scalar(n, 0.5),
            x.lerp(x * 2, 0.25),
        ]

    run_both(prog, dev)


def test_alpha_one_checked_once_per_key_float_alpha_every_call():
    # TORCH_TPU_DEBUG=1 counts each overflow check of a call's Scalars (metrics_report's
    # "scalar_check.aten::add"): an int alpha is part of the meta key, so its key is
    # checked once; a float alpha is keyed by sign and range only, so each call checks.
    code = textwrap.dedent(
        """
        import torch, torch_tpu_eager
        from torch_tpu_eager import _C
        a, b = torch.tensor([1.5]).to("tpu"), torch.tensor([-0.25]).to("tpu")
        def checks():
            return dict(_C._op_counts()).get("scalar_check.aten::add", 0)
        for _ in range(50):
            a + b
        ints = checks()
        for _ in range(50):
            torch.add(a, b, alpha=0.5)
        floats = checks() - ints
        print(ints, floats)
        """
    )
    env = dict(PYTHON_ENV, TORCH_TPU_DEBUG="1")  # this checkout's package
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ints, floats = map(int, proc.stdout.split()[-2:])
    assert ints == 1, f"50 records of a + b checked alpha {ints} times (want 1: the key's first call)"
    assert floats == 50, f"50 records with alpha=0.5 checked it {floats} times (want 50)"


def test_flushes_of_thousands_of_ops_keep_their_room_without_page_faults():
    # A flush of 2,000 nodes keeps the queue's room for the next one: recording the
    # next 2,000 ops touches no fresh pages (with room kept only up to 1,024 nodes,
    # each such flush freed ~1 MB and the next queue mapped it again: ~240 minor page
    # faults a flush, until glibc's thresholds adapted a few flushes later).
    code = textwrap.dedent(
        """
        import resource, torch, torch_tpu_eager
        torch_tpu_eager.set_queue_limits(max_ops=10**6, max_bytes=torch_tpu_eager.queue_limits()[1])
        a, b = torch.tensor([1.5]).to("tpu"), torch.tensor([-0.25]).to("tpu")
        faults = []
        for r in range(6):
            torch.tpu.synchronize()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(2000):
                a + b
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        torch.tpu.synchronize()
        print(*faults)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=PYTHON_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    faults = [int(x) for x in proc.stdout.split()[-6:]]
    # The first two rounds touch the two vectors the queue alternates between.
    assert max(faults[2:]) < 40, f"minor page faults per 2,000 records: {faults}"
