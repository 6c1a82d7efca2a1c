"""Tensor.set_ on "tpu" against CPU's set_storage_cpu_: the result's geometry and storage
size, and CPU's errors (type and message, from ATen's checkSetStorage) at the call; a
storage of another chip is refused as CUDA refuses another GPU's (found by test_torch's
`test_tensor_set_errors_multigpu`, which runs on CUDA only). A refused call leaves the
tensor as it was. The chip of a storage given or grown while another chip is current
(`set_()`, `resize_`, `UntypedStorage.resize_`) stays the tensor's, as on CUDA.
"""

import warnings

import pytest
import torch

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="compares the tpu device with CPU")


def _src(dev):
    return torch.arange(8.0, device=dev)


CASES = {
    "storage_whole": lambda d: torch.zeros(2, device=d).set_(_src(d).untyped_storage()),
    "tensor_view": lambda d: torch.zeros(2, device=d).set_(_src(d)[2:].view(2, 3)),
    "grow": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), 4, (3, 3), (3, 1)),
    "odd_bytes": lambda d: torch.zeros(2, device=d).set_(torch.zeros(3, dtype=torch.int8, device=d).untyped_storage()),
    "empty_offset_past_end": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), 100, (0,), (1,)),
    "same_sizes_offset_past_end": lambda d: torch.zeros(2, device=d).set_(_src(d).untyped_storage(), 100, (2,), (1,)),
    "unequal_lengths": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), 0, (2, 2), (1,)),
    "negative_offset": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), -1, (2,), (1,)),
    "negative_offset_and_size": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), -1, (-2,), (1,)),
    "negative_size": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), 0, (-2,), (1,)),
    "negative_stride": lambda d: torch.zeros(6, device=d).set_(_src(d).untyped_storage(), 0, (2,), (-1,)),
    "dtype": lambda d: torch.zeros(6, device=d).set_(torch.zeros(3, dtype=torch.int32, device=d)),
    "typed_storage_dtype": lambda d: torch.zeros(2, device=d).set_(
        torch.zeros(3, dtype=torch.int32, device=d).storage()
    ),
}


def _outcome(fn, dev):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            r = fn(dev)
        except Exception as e:  # noqa: BLE001 - the type and message are compared
            return type(e), str(e).split("\n")[0]
    # The first 4 elements only: "grow"'s storage gains uninitialized bytes past them.
    return tuple(r.shape), r.stride(), r.storage_offset(), r.untyped_storage().nbytes(), r.flatten()[:4].cpu().tolist()


@pytest.mark.parametrize("name", sorted(CASES))
def test_set_as_cpu(name):
    want = _outcome(CASES[name], "cpu")
    assert _outcome(CASES[name], "tpu") == want


def _devices_message(a, b):
    return (
        f'Attempted to set the storage of a tensor on device "{a}" to a storage on different device "{b}".'
        "  This is no longer allowed; the devices must match."
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda t, s: t.set_(s.untyped_storage()),
        lambda t, s: t.set_(s.untyped_storage(), 0, (3,), (1,)),
        lambda t, s: t.set_(s),
    ],
    ids=["storage", "storage_offset", "tensor"],
)
def test_other_chip_refused(call):
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two chips")
    t = torch.arange(2.0, device="tpu:0")
    s = torch.zeros(3, device="tpu:1")
    with pytest.raises(RuntimeError) as e:
        call(t, s)
    assert str(e.value).split("\n")[0] == _devices_message("tpu:0", "tpu:1")
    assert t.device == torch.device("tpu:0") and t.untyped_storage().device == torch.device("tpu:0")
    assert t.cpu().tolist() == [0.0, 1.0]


def test_host_storage_refused_as_cpu_refuses_a_device_storage():
    # CPU's kernel, given a tpu storage, names both devices; the tpu kernel does the same.
    with pytest.raises(RuntimeError) as cpu_err:
        torch.zeros(2).set_(torch.zeros(3, device="tpu").untyped_storage())
    assert str(cpu_err.value).split("\n")[0] == _devices_message("cpu", "tpu:0")
    with pytest.raises(RuntimeError) as e:
        torch.zeros(2, device="tpu").set_(torch.zeros(3).untyped_storage())
    assert str(e.value).split("\n")[0] == _devices_message("tpu:0", "cpu")


def test_refused_size_keeps_the_tensor():
    # CPU takes the storage before the size check fails; "tpu" puts its own back.
    t = torch.arange(6.0, device="tpu")
    with pytest.raises(RuntimeError, match="numel: integer multiplication overflow"):
        t.set_(torch.zeros(2, device="tpu").untyped_storage(), 0, (-2,), (1,))
    assert t.shape == (6,) and t.untyped_storage().nbytes() == 24
    assert (t + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def _two_chips():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two chips")


def test_set_empty_keeps_the_chip():
    # CPU's set_() gives the tensor an empty storage of its own device, not the current one's.
    _two_chips()
    r = torch.zeros(3, device="tpu:1").set_()
    assert (r.shape, r.device, r.untyped_storage().device) == ((0,), torch.device("tpu:1"), torch.device("tpu:1"))
    with torch.tpu.device(1):
        r = torch.zeros(3, device="tpu:0").set_()
    assert (r.device, r.untyped_storage().device) == (torch.device("tpu:0"), torch.device("tpu:0"))


GROWS = {
    "resize_": lambda t: t.resize_(1000),
    "set_": lambda t: t.set_(t.untyped_storage(), 0, (1000,), (1,)),
    "storage_resize_": lambda t: t.untyped_storage().resize_(4000),
    "out": lambda t: torch.add(torch.ones(1000, device=t.device), 1, out=t),
}


@pytest.mark.parametrize("name", sorted(GROWS))
def test_growth_stays_on_the_chip(name):
    # Growing a storage of chip 1 while chip 0 is current: the bytes stay on chip 1, as CUDA's
    # resize_bytes_cuda allocates under its storage's device guard.
    _two_chips()
    torch.tpu.synchronize(0)
    before = torch.tpu.memory_allocated(0)
    t = torch.arange(3.0, device="tpu:1")
    GROWS[name](t)
    assert t.untyped_storage().device == torch.device("tpu:1")
    assert torch.tpu.memory_allocated(0) <= before  # earlier tests' tensors may be freed meanwhile
    assert torch.tpu.memory_allocated(1) >= 4000
    if name != "out":
        assert t.untyped_storage().tolist()[:12] == torch.arange(3.0).untyped_storage().tolist()
