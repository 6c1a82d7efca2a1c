"""The record path's meta cache keys Scalar arguments by type, not value (so a changing
learning rate or Adam's bias corrections reuse the cached shapes), except for the range
factories whose result size depends on the values. Each case is compared with CPU."""

import pytest
import torch

from difftest import cpu_randn, run_both


@pytest.mark.parametrize("step", [0.5, 0.25, 0.3, 0.1])
def test_arange_size_follows_float_scalars(dev, step):
    run_both(lambda d: torch.arange(0.0, 2.0, step, device=d), dev)
    run_both(lambda d: torch.arange(1.5, 7.25, step * 3, device=d, dtype=torch.float64), dev)


@pytest.mark.parametrize("end", [1.0, 2.5, 10.0])
def test_range_linspace_logspace_follow_values(dev, end):
    run_both(lambda d: torch.range(0.0, end, 0.5, device=d), dev)
    run_both(lambda d: torch.linspace(0.0, end, 7, device=d), dev)
    run_both(lambda d: torch.logspace(0.0, end, 5, device=d), dev)


def test_changing_scalars_in_a_loop_match_cpu(dev):
    x, y, z = cpu_randn(5, 6, seed=1), cpu_randn(5, 6, seed=2), cpu_randn(5, 6, seed=3).abs() + 1

    def prog(d):
        a, b, c = x.to(d), y.to(d), z.to(d)
        outs = []
        for k in range(1, 6):
            a = a.add(b, alpha=0.1 * k)
            a = torch.addcdiv(a, b, c, value=-0.3 / k)
            a = a.lerp(b, 1.0 / (k + 1))
            outs.append(a * (0.5**k))
        return outs

    run_both(prog, dev)


def test_scalar_type_still_drives_promotion(dev):
    ints = torch.arange(6).reshape(2, 3)

    def prog(d):
        t = ints.to(d)
        return [
            t + 2,
            t + 2.5,
            t * 3,
            t * 0.5,
            t + True,
            torch.full((2,), 7, device=d),
            torch.full((2,), 7.5, device=d),
            torch.full((2,), True, device=d),
        ]

    run_both(prog, dev)


def test_integer_scalar_errors_still_raise_like_cpu(dev):
    ints = torch.arange(1, 5)

    def prog(d):
        t = ints.to(d)
        ok = t.pow(2)
        return ok, t.pow(-1)

    from difftest import run_both_outcome

    run_both_outcome(prog, dev)


def test_adam_with_changing_lr_matches_cpu(dev):
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4)

    def prog(d):
        model = torch.nn.Linear(8, 4)
        model.load_state_dict(ref.state_dict())
        model.to(d)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        x = cpu_randn(16, 8, seed=4).to(d)
        for _ in range(4):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        return [p.detach() for p in model.parameters()]

    run_both(prog, dev, rtol=1e-5, atol=1e-6)
