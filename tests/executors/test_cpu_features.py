"""The executors' one CPU-feature probe (csrc/executors/cpu_features.h) and its switch.

Every vector kernel of csrc/executors chooses its build by ``cpu::has``; a test can
switch a feature off (``difftest.cpu_features_off``) to run the narrower build on a CPU
that has the wider one. The probe is checked against the kernel's own account of the
CPU (/proc/cpuinfo's flags), and the narrower builds against CPU PyTorch.
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import cpu_features_off, requires_tpu

pytestmark = requires_tpu

NAMES = ("avx2", "fma", "f16c", "avx512f")


def _features():
    from torch_tpu_eager import _C

    return _C._cpu_features()


def _cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    pytest.skip("no /proc/cpuinfo flags on this system")


def test_probe_matches_cpuinfo():
    flags = _cpuinfo_flags()
    assert _features() == {n: n in flags for n in NAMES}


def test_switch_off_and_restore():
    from torch_tpu_eager import _C

    present = _features()
    with cpu_features_off("avx512f", "fma"):
        now = _features()
        assert now == {n: present[n] and n not in ("avx512f", "fma") for n in NAMES}
        with cpu_features_off("avx2"):  # replaces the set, then restores it
            assert _features() == {n: present[n] and n != "avx2" for n in NAMES}
        assert _features() == now
    assert _features() == present
    assert _C._set_cpu_features_off([]) == []


def test_unknown_feature_raises_and_changes_nothing():
    from torch_tpu_eager import _C

    present = _features()
    with pytest.raises(ValueError, match="unknown CPU feature 'sse9'"):
        _C._set_cpu_features_off(["avx2", "sse9"])
    assert _features() == present


@pytest.fixture
def tpu_v5e():
    import torch_tpu_eager as tte

    before = tte.get_target()
    tte.set_target("tpu-v5e")
    try:
        yield
    finally:
        tte.set_target(before)


@pytest.mark.parametrize("off", [(), ("avx2",)], ids=["as_probed", "avx2_off"])
def test_max_pool_and_batch_norm_without_avx2(tpu_v5e, off):
    # The host kernels of max_pool2d (2x2 planes) and batch norm's statistics
    # (channels in AVX2 lanes) take their scalar loops with AVX2 switched off:
    # CPU's values and indices bit for bit either way.
    if off and not _features()["avx2"]:
        pytest.skip("this CPU has no AVX2: the scalar loops are the only build")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 12, 14, generator=g)
    x[0, 1, 2:4, 2:4] = 0.5  # ties: the first index wins
    w, b = torch.randn(5, generator=g), torch.randn(5, generator=g)
    with cpu_features_off(*off):
        v, i = F.max_pool2d(x.to("tpu"), 2, 2, return_indices=True)
        rm, rv = torch.zeros(5, device="tpu"), torch.ones(5, device="tpu")
        y = F.batch_norm(x.to("tpu"), rm, rv, w.to("tpu"), b.to("tpu"), training=True, momentum=0.3)
        got = [t.cpu() for t in (v, i, y, rm, rv)]
    cv, ci = F.max_pool2d(x, 2, 2, return_indices=True)
    crm, crv = torch.zeros(5), torch.ones(5)
    cy = F.batch_norm(x, crm, crv, w, b, training=True, momentum=0.3)
    for g_, c in zip(got, (cv, ci, cy, crm, crv)):
        assert torch.equal(g_, c)


@pytest.mark.parametrize("off", [(), ("avx2",), ("f16c",)], ids=["as_probed", "avx2_off", "f16c_off"])
def test_fused_loops_switched_off(tpu_v5e, off):
    # The TPU target's fused loops need AVX2, FMA and F16C: with one switched
    # off its regions run op by op (CPU's kernels), with CPU's values.
    x = torch.randn(1000, 37, generator=torch.Generator().manual_seed(4))

    def f(t):
        return ((t * 2 + 1).relu() - t).abs().to(torch.float16)

    with cpu_features_off(*off):
        got = f(x.to("tpu")).cpu()
    assert torch.equal(got, f(x))
