"""Streams of the "tpu" chips (lanes of a chip's queue), against CUDA's stream contract."""

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0
two_chips = pytest.mark.skipif(N < 2, reason="needs TORCH_TPU_NUM_DEVICES >= 2")


def _C():
    import torch_tpu_eager

    return torch_tpu_eager._C


def test_default_and_current_stream():
    s = torch.tpu.current_stream()
    assert isinstance(s, torch.tpu.Stream) and isinstance(s, torch.Stream)
    assert s == torch.tpu.default_stream() and s.stream_id == 0
    assert s.device == torch.device("tpu", 0)
    assert torch.accelerator.current_stream() == s


def test_new_streams_are_distinct():
    a, b = torch.tpu.Stream(), torch.tpu.Stream()
    assert a != b and a.stream_id != 0 and b.stream_id != 0
    c = torch.Stream(device="tpu")
    assert c.device.type == "tpu" and c not in (a, b)


def test_priority_is_cudas_read_only_attribute_with_its_range():
    # torch.cuda.Stream: `priority` a read-only int, `priority_range()` (least, greatest) with
    # least 0, and a priority outside the range "mapped to the nearest valid priority". The
    # simulated chips have none but 0: cudaDeviceGetStreamPriorityRange's (0, 0).
    least, greatest = torch.tpu.Stream.priority_range()
    assert (least, greatest) == (0, 0) == torch.tpu.current_stream().priority_range()
    for p in (-10, -1, 0, 1, 10):
        s = torch.tpu.Stream(priority=p)
        assert isinstance(s.priority, int) and greatest <= s.priority <= least
    assert torch.tpu.current_stream().priority == 0 == torch.tpu.default_stream(0).priority
    high = torch.tpu.Stream(priority=greatest)
    with torch.tpu.stream(high):
        assert torch.tpu.current_stream().priority == high.priority
    with pytest.raises(AttributeError):
        high.priority = -1
    with pytest.raises(TypeError):
        torch.tpu.Stream(priority="high")


def test_stream_context_sets_and_restores():
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        x = torch.ones(4, device="tpu") * 2
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    assert x.sum().item() == 8
    with pytest.raises(KeyError):
        with torch.tpu.stream(s):
            raise KeyError("x")
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    with torch.tpu.stream(None):
        assert torch.tpu.current_stream() == torch.tpu.default_stream()


def test_set_stream():
    s = torch.tpu.Stream()
    torch.tpu.set_stream(s)
    try:
        assert torch.tpu.current_stream() == s
    finally:
        torch.tpu.set_stream(torch.tpu.default_stream())
    torch.tpu.set_stream(None)
    assert torch.tpu.current_stream().stream_id == 0


def test_query_and_synchronize():
    C = _C()
    s = torch.tpu.Stream()
    assert s.query()
    with torch.tpu.stream(s):
        y = torch.ones(64, 64, device="tpu") @ torch.ones(64, 64, device="tpu")
    assert not s.query()  # pending work on s
    assert torch.tpu.default_stream().query()  # nothing pending on the default stream
    s.synchronize()
    assert s.query() and not C._storage_has_pending(y)
    assert y[0, 0].item() == 64


def test_switching_streams_keeps_values_and_program_order():
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    a = torch.arange(10.0)
    with torch.tpu.stream(s1):
        x = a.to("tpu") * 2
    with torch.tpu.stream(s2):
        s2.wait_stream(s1)
        y = x + 1
    with torch.tpu.stream(s1):
        x.mul_(10)
    torch.testing.assert_close(y.cpu(), a * 2 + 1)
    torch.testing.assert_close(x.cpu(), a * 20)


def test_wait_event_and_wait_stream_accept_tpu_objects_only():
    s = torch.tpu.Stream()
    e = torch.tpu.Event()
    e.record()
    s.wait_event(e)
    s.wait_stream(torch.tpu.current_stream())
    with pytest.raises(TypeError):
        torch.tpu.set_stream("tpu")
    with pytest.raises(TypeError):
        torch.tpu.stream(3)
    assert torch.ones(2, device="tpu").sum().item() == 2


@two_chips
def test_streams_of_chip_one():
    s = torch.tpu.Stream(1)
    assert s.device == torch.device("tpu", 1)
    with torch.tpu.stream(s):
        assert torch.tpu.current_device() == 1
        z = torch.ones(3, device="tpu") + 1
    assert torch.tpu.current_device() == 0
    assert z.device.index == 1 and z.sum().item() == 6
    assert torch.tpu.current_stream(1).stream_id == 0
    assert torch.Stream(device="tpu:1").device.index == 1
    with pytest.raises(torch.AcceleratorError):
        torch.tpu.Stream(N)


def test_accelerator_synchronize_with_streams():
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        y = torch.ones(8, device="tpu") * 5
    torch.accelerator.synchronize()
    assert s.query() and y.sum().item() == 40


def test_record_stream_keeps_values_of_a_tensor_freed_under_pending_work():
    # CUDA's contract: after t.record_stream(s), t's memory is not reused before the work
    # queued on s ran; the values read there are t's (CPU reference: the host copy).
    host = torch.arange(1000.0)
    s = torch.tpu.Stream()
    t = host.to("tpu")
    with torch.tpu.stream(s):
        t.record_stream(s)
        u = t * 2
    del t
    v = torch.full((1000,), -1.0, device="tpu")  # may take t's freed block
    torch.tpu.current_stream().wait_stream(s)
    torch.testing.assert_close(u.cpu(), host * 2)
    torch.testing.assert_close(v.cpu(), torch.full((1000,), -1.0))
    with pytest.raises(RuntimeError):
        torch.ones(2, device="tpu").record_stream(torch.Stream(device="cpu"))
