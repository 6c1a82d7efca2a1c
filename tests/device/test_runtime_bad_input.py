"""Bad input to every runtime function raises what CUDA raises, and the device stays usable.

CUDA's contract (torch.cuda / torch.accelerator): an ordinal outside
0..device_count()-1 raises torch.AcceleratorError ("invalid device ordinal");
a device of another type raises ValueError ("Expected a cuda device"); a value
that is no device raises ValueError (torch's _get_device_index); a negative
index given to ``torch.cuda.device`` / ``torch.accelerator.set_device_index`` is
a no-op.
"""

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0

TPU_FUNCS = [
    "set_device",
    "current_stream",
    "default_stream",
    "synchronize",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "mem_get_info",
    "get_rng_state",
    "Stream",
]
# torch.cuda's property queries raise AssertionError("Invalid device id") for a bad
# ordinal instead (tests/device/test_device_properties.py); the other checks are the same.
PROPERTY_FUNCS = ["get_device_properties", "get_device_name", "get_device_capability"]
ACCEL_FUNCS = [
    "synchronize",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "get_memory_info",
    "get_device_capability",
    "current_stream",
]


def _usable():
    for d in range(N):
        x = torch.arange(4.0, device=f"tpu:{d}")
        assert (x * 2).sum().item() == 12.0
    torch.tpu.set_device(0)


@pytest.mark.parametrize("fn", TPU_FUNCS)
@pytest.mark.parametrize("bad", [99, -2, "tpu:99", torch.device("tpu", 50)])
def test_invalid_ordinal_raises_accelerator_error(fn, bad):
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        getattr(torch.tpu, fn)(bad)
    _usable()


@pytest.mark.parametrize("fn", TPU_FUNCS + PROPERTY_FUNCS)
@pytest.mark.parametrize("bad", ["cpu", "cuda:0", torch.device("cpu")])
def test_device_of_another_type_raises_value_error(fn, bad):
    with pytest.raises(ValueError, match="Expected a tpu device"):
        getattr(torch.tpu, fn)(bad)
    _usable()


@pytest.mark.parametrize("fn", TPU_FUNCS + PROPERTY_FUNCS)
@pytest.mark.parametrize("bad", [1.5, object(), [0]])
def test_not_a_device_raises_value_error(fn, bad):
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index or an integer"):
        getattr(torch.tpu, fn)(bad)
    _usable()


@pytest.mark.parametrize("fn", ACCEL_FUNCS)
@pytest.mark.parametrize("bad", [99, -2, "tpu:99"])
def test_accelerator_invalid_ordinal(fn, bad):
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        getattr(torch.accelerator, fn)(bad)
    _usable()


@pytest.mark.parametrize("fn", ACCEL_FUNCS + ["set_device_index"])
def test_accelerator_device_of_another_type(fn):
    with pytest.raises(ValueError, match="doesn't match the current accelerator"):
        getattr(torch.accelerator, fn)("cpu")
    _usable()


def test_negative_index_is_a_no_op_as_cuda():
    torch.tpu.set_device(0)
    torch.accelerator.set_device_index(-1)
    assert torch.accelerator.current_device_index() == 0
    with torch.tpu.device(-1):
        assert torch.tpu.current_device() == 0
    with pytest.raises(torch.AcceleratorError):
        torch.tpu.device(99)
    _usable()


def test_stream_of_raw_invalid_chip_does_not_crash():
    # A torch.Stream built from raw ids can name a chip that does not exist:
    # entering it must neither crash the process nor change any chip's stream.
    before = torch.tpu.current_stream(0)
    dtype = before.device_type
    s = torch.Stream(stream_id=0, device_index=N + 3, device_type=dtype)
    try:
        with s:
            pass
    except RuntimeError:
        pass
    assert torch.tpu.current_stream(0) == before
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.accelerator.current_stream(N + 3)
    _usable()


def test_streams_and_events_of_wrong_type():
    with pytest.raises(TypeError):
        torch.tpu.set_stream(1)
    with pytest.raises(TypeError):
        torch.tpu.stream("s")
    e = torch.tpu.Event(enable_timing=True)
    e.record()
    with pytest.raises(RuntimeError, match="expected other to be a torch.Event"):
        e.elapsed_time(3)
    with pytest.raises(AttributeError):  # CUDA's Stream.wait_event calls event.wait(self)
        torch.tpu.current_stream().wait_event(3)
    with pytest.raises(RuntimeError, match="does not match recording stream's device type"):
        torch.Event(device="cpu").record(torch.tpu.current_stream())
    _usable()


@pytest.mark.skipif(N < 2, reason="needs two chips")
def test_event_and_stream_of_another_chip():
    s1 = torch.tpu.Stream("tpu:1")
    e0 = torch.tpu.Event(enable_timing=True)
    e0.record()  # on tpu:0
    with pytest.raises(RuntimeError, match="does not match recording stream's device index"):
        e0.record(s1)
    e1 = torch.tpu.Event(enable_timing=True)
    e1.record(s1)
    with pytest.raises(RuntimeError):
        e0.elapsed_time(e1)
    # As CUDA: a stream may wait for an event or stream of another device.
    torch.tpu.current_stream().wait_event(e1)
    torch.tpu.current_stream().wait_stream(s1)
    _usable()


@pytest.mark.parametrize(
    "make",
    [
        lambda s: s.float(),  # not a ByteTensor
        lambda s: s.to("tpu"),  # not on the host (its bytes may be pending)
        lambda s: torch.stack([s, s], 1)[:, 0],  # not contiguous
    ],
    ids=["float", "tpu", "noncontiguous"],
)
def test_generator_set_state_checks_as_cuda(make):
    # Every ATen generator's set_state starts with at::detail::check_rng_state
    # (CUDA's and CPU's): a contiguous CPU ByteTensor, else TypeError /
    # RuntimeError. The CPU generator is the reference for the exception.
    cpu_gen, gen = torch.Generator(), torch.Generator("tpu")
    with pytest.raises(Exception) as cpu_err:
        cpu_gen.set_state(make(cpu_gen.get_state()))
    with pytest.raises(type(cpu_err.value), match=str(cpu_err.value)):
        gen.set_state(make(gen.get_state()))
    _usable()


def test_rng_state_of_the_seed_alone_and_a_strided_state():
    # CUDA's state is (seed, offset); 8 bytes set the seed with offset 0.
    gen = torch.Generator("tpu").manual_seed(5)
    gen.set_offset(40)
    seed_only = gen.get_state()[:8].clone()
    gen.set_offset(80)
    gen.set_state(seed_only)
    assert (gen.initial_seed(), gen.get_offset()) == (5, 0)
    # torch.cuda.set_rng_state clones to contiguous first: a strided state is taken.
    state = torch.tpu.get_rng_state()
    a = torch.rand(4, device="tpu").cpu()
    torch.tpu.set_rng_state(torch.stack([state, state], 1)[:, 1])
    assert torch.equal(torch.rand(4, device="tpu").cpu(), a)


def test_other_runtime_functions_reject_bad_values():
    with pytest.raises(RuntimeError, match="RNG state is wrong size"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError):
        torch.tpu.set_rng_state([1, 2])
    with pytest.raises(ValueError):
        torch.tpu.manual_seed("a")
    with pytest.raises(ValueError):
        torch.tpu.manual_seed_all("a")
    with pytest.raises(ValueError):
        torch.tpu.precision(3)
    with pytest.raises(ValueError):
        torch.tpu.set_eager_mode("x")
    with pytest.raises(ValueError):
        torch.tpu.set_device_count(0)
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.ones(2).to("tpu:9")
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.Stream(device="tpu:9")
    _usable()
