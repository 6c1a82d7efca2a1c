"""Events of the "tpu" chips: record/query/synchronize/wait, elapsed_time in simulated time."""

import pytest
import torch

from difftest import REPO_ROOT, requires_tpu

pytestmark = requires_tpu

N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0
two_chips = pytest.mark.skipif(N < 2, reason="needs TORCH_TPU_NUM_DEVICES >= 2")


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _simulated_ms(fn):
    tte = _tte()
    torch.tpu.synchronize()
    before = tte.metrics()["sim_time_s"]
    fn()
    torch.tpu.synchronize()
    return (tte.metrics()["sim_time_s"] - before) * 1e3


def test_elapsed_time_is_simulated_time_of_the_kernels_between():
    x = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    y = x @ x
    end.record()
    ms = start.elapsed_time(end)
    # The same work measured by the metrics' simulated time.
    keep = []
    expected = _simulated_ms(lambda: keep.append(x @ x))  # kept: a dead result is never computed
    assert ms > 0
    assert ms == pytest.approx(expected, rel=1e-9)
    assert end.query() and start.query()
    end.synchronize()
    del y


def test_elapsed_time_grows_with_work():
    x = torch.randn(256, 256, device="tpu")
    times = []
    for k in (1, 4):
        a, b = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu", enable_timing=True)
        a.record()
        y = x
        for _ in range(k):
            y = y @ x
        b.record()
        times.append(a.elapsed_time(b))
    assert times[1] > 3 * times[0] > 0


def test_torch_event_device_tpu():
    e = torch.Event(device="tpu", enable_timing=True)
    assert e.device.type == "tpu"
    e.record()
    assert e.query()
    e.synchronize()


def test_elapsed_time_errors_as_cuda():
    a, b = torch.tpu.Event(), torch.tpu.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):  # torch.Event raises ValueError
        a.elapsed_time(b)
    c, d = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    c.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        c.elapsed_time(d)
    assert torch.ones(2, device="tpu").sum().item() == 2


def test_events_order_work_between_streams():
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    a = torch.randn(128, 128)
    x = a.to("tpu")
    with torch.tpu.stream(s1):
        y = x @ x
        done = s1.record_event(torch.tpu.Event(enable_timing=True))
    with torch.tpu.stream(s2):
        start = torch.tpu.Event(enable_timing=True)
        start.record()
        done.wait()  # s2's later work starts after s1's matmul in simulated time
        z = y + 1
        end = torch.tpu.Event(enable_timing=True)
        end.record()
    torch.testing.assert_close(z.cpu(), a @ a + 1, rtol=1e-4, atol=1e-4)
    assert start.elapsed_time(end) >= start.elapsed_time(done) - 1e-12


# Ways the host waits for the default stream's work (CUDA: after each, that work has ended).
HOST_WAITS = {
    "item": lambda y: y.sum().item(),
    "cpu": lambda y: y.cpu(),
    "tpu_synchronize": lambda y: torch.tpu.synchronize(),
    "accelerator_synchronize": lambda y: torch.accelerator.synchronize(),
    "stream_synchronize": lambda y: torch.tpu.current_stream().synchronize(),
    "event_synchronize": lambda y: torch.tpu.current_stream().record_event().synchronize(),
}


@pytest.mark.parametrize("wait", sorted(HOST_WAITS))
def test_an_idle_stream_starts_after_the_host_waited(wait):
    # CUDA: once the host has waited for the default stream's work, work it then issues on
    # another (idle or new) stream starts later, so an event recorded on the default stream
    # followed by work and an event on the other stream times that work. The other stream's
    # clock started at 0 (break21): elapsed_time was negative, the default stream's work.
    x = torch.randn(256, 256, device="tpu")
    y = x @ x @ x @ x
    HOST_WAITS[wait](y)
    s = torch.tpu.Stream()
    start, mid, end = (torch.tpu.Event(enable_timing=True) for _ in range(3))
    start.record()
    mid.record(s)
    with torch.tpu.stream(s):
        z = x @ x
        end.record(s)
    end.synchronize()
    keep = []
    matmul_ms = _simulated_ms(lambda: keep.append(x @ x))
    assert start.elapsed_time(mid) == pytest.approx(0.0, abs=1e-12)
    assert start.elapsed_time(end) == pytest.approx(matmul_ms, rel=1e-9)
    torch.testing.assert_close(z.cpu(), keep[0].cpu())


def test_work_recorded_before_a_wait_runs_before_it():
    # CUDA: a stream's work enqueued before wait_event is not delayed by the event.
    x = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    one = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    with torch.tpu.stream(s1):
        one[0].record()
        y = x @ x
        one[1].record()
        done = s1.record_event()
    matmul_ms = one[0].elapsed_time(one[1])
    with torch.tpu.stream(s2):
        start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
        start.record()
        w = x @ x  # still queued when s2 starts waiting
        s2.wait_event(done)
        end.record()
    # s2 runs its matmul while s1 runs its own: both end together, one matmul after the start
    assert matmul_ms > 0
    assert start.elapsed_time(end) == pytest.approx(matmul_ms, rel=1e-9)
    torch.testing.assert_close(w.cpu(), y.cpu())


def test_event_wait_unrecorded_is_noop_and_record_on_other_stream():
    e = torch.tpu.Event()
    e.wait()  # never recorded: nothing to wait for, as on CUDA
    s = torch.tpu.Stream()
    e.record(s)
    assert e.query()


def test_event_bad_stream_arguments():
    e = torch.tpu.Event()
    assert isinstance(e, torch.tpu.Event) and isinstance(e, torch.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.tpu.Event)
    with pytest.raises((TypeError, RuntimeError)):
        e.record("tpu")
    with pytest.raises(RuntimeError, match="does not match recording stream's device type"):
        e.record(torch.Stream(stream_id=0, device_index=0, device_type=0))  # a CPU stream
    assert torch.ones(2, device="tpu").sum().item() == 2


@two_chips
def test_event_of_another_chip_raises_as_cuda():
    e = torch.tpu.Event()
    e.record(torch.tpu.Stream(0))
    with pytest.raises(RuntimeError, match="does not match recording stream's device index"):
        e.record(torch.tpu.Stream(1))
    a, b = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    a.record(torch.tpu.current_stream(0))
    b.record(torch.tpu.current_stream(1))
    with pytest.raises(RuntimeError):
        a.elapsed_time(b)
    assert torch.ones(2, device="tpu:1").sum().item() == 2


@two_chips
def test_two_chips_example_runs():
    import importlib.util
    import os

    path = os.path.join(REPO_ROOT, "examples", "two_chips.py")
    spec = importlib.util.spec_from_file_location("two_chips", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    jobs = mod.main(["--steps", "3"])
    assert [j["chip"] for j in jobs] == [0, 1]
    for j in jobs:
        assert all(ms > 0 for ms in j["ms"])
        assert all(p.device.index == j["chip"] for p in j["model"].parameters())
    assert sum(jobs[1]["ms"]) > sum(jobs[0]["ms"])
