"""torch.tpu.get_device_properties / get_device_name / get_device_capability."""

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


@pytest.mark.parametrize(
    "target,name,major_minor",
    [
        ("tpu-v4", "TPU v4 (simulated)", (4, 0)),
        ("tpu-v5e", "TPU v5e (simulated)", (5, 0)),
        ("tpu-v5p", "TPU v5p (simulated)", (5, 1)),
        ("tpu-v6e", "TPU v6e (simulated)", (6, 0)),
    ],
)
def test_properties_come_from_the_chip_data(target, name, major_minor):
    tte = _tte()
    before = tte.get_target()
    try:
        tte.set_target(target)
        info = tte.target_info()
        p = torch.tpu.get_device_properties(0)
        assert p.name == name == torch.tpu.get_device_name(0) == torch.tpu.get_device_name()
        assert p.total_memory == info["hbm_bytes"]
        assert p.multi_processor_count == info["tensor_cores"]
        assert p.vmem_bytes == info["vmem_bytes"]
        assert p.mxu_shape == (info["mxu_size"], info["mxu_size"])
        assert p.mxu_count == info["mxus_per_core"]
        assert (p.major, p.minor) == major_minor == torch.tpu.get_device_capability(0)
        assert "hbm_bytes" in p.sources and p.sources["hbm_bytes"]
        assert name in repr(p)
    finally:
        tte.set_target(before)


def test_spyre_properties(spyre_target):
    info = spyre_target.target_info()
    p = torch.tpu.get_device_properties()
    assert p.name == "IBM Spyre (simulated)"
    assert p.total_memory == info["dram_bytes"]
    assert p.multi_processor_count == info["cores"]


def test_every_chip_and_device_forms():
    for i in range(torch.tpu.device_count()):
        assert torch.tpu.get_device_properties(i).index == i
        assert torch.tpu.get_device_properties(f"tpu:{i}").index == i
        assert torch.tpu.get_device_properties(torch.device("tpu", i)).index == i


@pytest.mark.parametrize("fn", ["get_device_properties", "get_device_name", "get_device_capability"])
@pytest.mark.parametrize("bad", [-1, -2, "count", "tpu:count", "device:count"])
def test_invalid_id_raises_assertion_error_as_cuda(fn, bad):
    # torch.cuda.get_device_properties (and get_device_name / get_device_capability, which
    # call it): `if device < 0 or device >= device_count(): raise AssertionError("Invalid
    # device id")`, so -1 raises there although it means "the current device" elsewhere.
    n = torch.tpu.device_count()
    arg = {"count": n, "tpu:count": f"tpu:{n}", "device:count": torch.device("tpu", n)}.get(bad, bad)
    with pytest.raises(AssertionError, match="^Invalid device id$"):
        getattr(torch.tpu, fn)(arg)
    assert torch.ones(2, device="tpu").sum().item() == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="Expected a tpu device"):
        torch.tpu.get_device_properties("cpu")
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index or an integer"):
        torch.tpu.get_device_name([0])
    with pytest.raises(ValueError):
        torch.tpu.get_device_capability(1.5)
    assert torch.tpu.get_device_properties(torch.device("tpu")).index == torch.tpu.current_device()
    assert torch.ones(2, device="tpu").sum().item() == 2
