"""The Spyre target's job plan (issue 6, item 5): a SpyreCode-like manifest of each flush
(H2D, Compute, D2H steps over symbolic tensor arguments patched to device addresses at
launch), and Spyre numerics on ops that run eagerly (record time), not through a region.
"""

import json

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def _program(x, w, b):
    h = torch.relu(x @ w + b)
    s = torch.softmax(h, dim=-1)
    return s, s.sum(dim=0)


def _check_plan(plan, stick):
    args = {a["symbol"]: a for a in plan["args"]}
    assert len(args) == len(plan["args"])
    # Every symbolic address is patched: stick-aligned, non-overlapping, within the total.
    spans = sorted((a["address"], a["address"] + a["bytes"]) for a in plan["args"])
    assert all(a["address"] >= 0 and a["address"] % stick == 0 for a in plan["args"])
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))
    assert sum(a["bytes"] for a in plan["args"]) == plan["device_bytes"]
    for a in plan["args"]:
        assert a["sticks"] == -(-a["numel"] // a["stick_elems"]) and a["bytes"] == a["sticks"] * stick
    # Data dependencies: a Compute reads only values copied in or written before;
    # every copy-in is read later; D2H copies out written values after the last Compute.
    on_device, written, seen_d2h = set(), set(), False
    kinds = [s["kind"] for s in plan["steps"]]
    last_compute = max(i for i, k in enumerate(kinds) if k == "Compute")
    for i, step in enumerate(plan["steps"]):
        assert step["kind"] in ("H2D", "Compute", "D2H")
        if step["kind"] == "H2D":
            assert not seen_d2h and step["arg"] in args and step["arg"] not in on_device
            assert any(step["arg"] in s.get("reads", ()) for s in plan["steps"][i + 1 :])
            on_device.add(step["arg"])
        elif step["kind"] == "Compute":
            assert not seen_d2h
            for r in step["reads"]:
                assert r in on_device, (r, step)
            for w in step["writes"]:
                on_device.add(w)
                written.add(w)
        else:
            seen_d2h = True
            assert i > last_compute and step["arg"] in written
    assert {s["arg"] for s in plan["steps"] if s["kind"] == "D2H"} == written
    return args


def test_job_plan_steps_and_patched_arguments(spyre_target):
    from torch_tpu_eager import spyre

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(16, 40, generator=g), torch.randn(40, 24, generator=g), torch.randn(24, generator=g)
    got = _program(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    plan = spyre.job_plan()
    for gt, want in zip(got, _program(x, w, b)):
        assert torch.allclose(gt.cpu(), want, rtol=1e-5, atol=1e-6)
    computes = [s for s in plan["steps"] if s["kind"] == "Compute"]
    assert [s["region"] for s in computes] == list(range(len(computes)))
    assert len(computes) == len(spyre.last_schedule()) == len(spyre.dump_ktir().split("ktir.kernel")) - 1
    assert [s["kernel"] for s in computes] == [s["kernel"] for s in spyre.last_schedule()]
    args = _check_plan(plan, 128)
    # A later region reads what an earlier one wrote: on the device already, no H2D.
    assert len(computes) >= 2
    written_before = set(computes[0]["writes"])
    assert any(set(c["reads"]) & written_before for c in computes[1:])
    # The three inputs are copied in with their device layout.
    h2d = [s["arg"] for s in plan["steps"] if s["kind"] == "H2D"]
    assert sorted(args[a]["numel"] for a in h2d) == sorted([16 * 40, 40 * 24, 24])
    assert all(args[a]["dtype"] == "f32" and args[a]["stick_elems"] == 32 for a in h2d)


def test_job_plan_of_16bit_and_int64_values_uses_device_dtypes(spyre_target):
    from torch_tpu_eager import spyre

    x = torch.randn(3, 70).half().to("tpu")
    i = torch.arange(10).to("tpu")
    y = (x * 2, i + 1)
    plan = spyre.job_plan()
    _check_plan(plan, 128)
    dtypes = {a["dtype"]: a for a in plan["args"]}
    assert dtypes["df16"]["stick_elems"] == 64 and dtypes["i32"]["stick_elems"] == 32
    del y


def test_dump_job_plan_round_trips_json(spyre_target, tmp_path):
    from torch_tpu_eager import spyre

    x = torch.randn(8, 64).to("tpu")
    z = torch.exp(x) + x
    plan = spyre.dump_job_plan(tmp_path / "plan.json")
    with open(tmp_path / "plan.json") as f:
        assert json.load(f) == plan == spyre.job_plan()
    assert torch.allclose(z.cpu(), torch.exp(x.cpu()) + x.cpu())


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"format": "yaml"}, ValueError),
        ({"indent": -1}, ValueError),
        ({"indent": "2"}, ValueError),
    ],
)
def test_dump_job_plan_bad_options_raise(tmp_path, kwargs, exc):
    from torch_tpu_eager import spyre

    with pytest.raises(exc):
        spyre.dump_job_plan(tmp_path / "p.json", **kwargs)
    assert not (tmp_path / "p.json").exists()


def test_dump_job_plan_bad_path_raises_type_error():
    from torch_tpu_eager import spyre

    with pytest.raises(TypeError, match="path"):
        spyre.dump_job_plan(3.5)


# ------------------------------------------------ eager path keeps Spyre numerics


def test_eager_float16_result_is_rounded_through_df16(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import spyre

    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, generator=g).half()
    d = x.to("tpu")
    before = tte.metrics()["eager_ops"]
    d.mul_(d[:])  # the written argument fully overlaps an input: runs eagerly
    assert tte.metrics()["eager_ops"] == before + 1
    xr = spyre.df16_round(x)
    want = spyre.df16_round(xr * xr)
    assert not torch.equal(want, xr * xr)  # the rounding is visible in this data
    assert torch.equal(d.cpu(), want)


def test_eager_int64_result_outside_int32_raises_overflow_error(spyre_target):
    tte = spyre_target
    a = torch.tensor([2**30, 3]).to("tpu")
    before = tte.metrics()["eager_ops"]
    with pytest.raises(OverflowError, match="mul_.*run eagerly"):
        a.mul_(a[:])
    assert tte.metrics()["eager_ops"] == before + 1
    ok = torch.tensor([5, 6]).to("tpu")
    assert torch.equal((ok + 1).cpu(), torch.tensor([6, 7]))


def test_eager_data_dependent_op_on_spyre_matches_cpu(spyre_target):
    x = torch.tensor([[0, 3], [2**20, 0]])
    assert torch.equal(torch.nonzero(x.to("tpu")).cpu(), torch.nonzero(x))
    h = torch.tensor([1.0, 2.5, 3.0, 0.1]).half()
    m = h > 1
    got = torch.masked_select(h.to("tpu"), m.to("tpu")).cpu()
    from torch_tpu_eager import spyre

    assert torch.equal(got, torch.masked_select(spyre.df16_round(h), m))


def test_eager_int64_is_unchecked_on_the_tpu_target():
    import torch_tpu_eager as tte

    assert tte.get_target().startswith("tpu")
    a = torch.tensor([2**30, 3]).to("tpu")
    a.mul_(a[:])
    assert torch.equal(a.cpu(), torch.tensor([2**60, 9]))
