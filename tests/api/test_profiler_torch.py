"""torch.profiler on "tpu": simulated kernels as PrivateUse1 device events.

The contract (PyTorch's profiler docs and what CUDA shows): with
``ProfilerActivity.PrivateUse1`` each device kernel is an event of device type
PrivateUse1 on the device's track of the Chrome trace (``"cat": "kernel"``,
pid = chip, tid = stream), lasting its (here: simulated) device time; kernels
of one stream do not overlap; ``key_averages()`` fills the device-time
columns and never shows a negative time. ``torch.autograd.profiler.profile(
use_device="tpu")`` (the legacy, non-kineto path) gives each op the device
time of the kernels that ran during it. A c10d collective of "tpu_ccl" is a
device event "ici::<op>" linked to its c10d op (tests/distributed/test_ici.py checks its
simulated time, track and overlap).

Deferred execution: a kernel runs when the queue flushes, but it is linked
(kineto correlation) to the op that recorded its first op, as a CUDA kernel is
to the op that launched it; work recorded before the session is linked to no
op. A stream's wait on an event (``wait_event`` / ``wait_stream``) is a device
event "Stream Wait Event" (``"cat": "cuda_sync"``, as in CUDA's traces) on the
waiting stream's track, with ``wait_on_stream``; the stream's next kernels
start after it.
"""

import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from difftest import requires_tpu

pytestmark = requires_tpu

N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0
two_chips = pytest.mark.skipif(N < 2, reason="needs TORCH_TPU_NUM_DEVICES >= 2")
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _step(x):
    y = (x @ x).relu().sum(0)
    z = (x * 2 + 1).tanh()
    return y.cpu(), z.cpu()


def _no_negative(averages):
    for a in averages:
        for attr in (
            "cpu_time_total",
            "self_cpu_time_total",
            "device_time_total",
            "self_device_time_total",
            "cpu_time",
            "device_time",
        ):
            assert getattr(a, attr) >= 0, (a.key, attr, getattr(a, attr))


def test_privateuse1_is_a_supported_activity():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


def test_kernels_are_device_events_with_their_simulated_durations():
    x = torch.randn(128, 128, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof, _tte().profile() as ours:
        _step(x)
    dev = _device_events(prof)
    kernels = ours.kernels
    assert len(dev) == len(kernels) > 0
    # Same kernels, same order, same simulated durations (us; the trace has ns resolution).
    assert [e.name for e in dev] == [k["name"] for k in kernels]
    for e, k in zip(dev, kernels):
        assert e.time_range.elapsed_us() == pytest.approx(k["sim_time_s"] * 1e6, abs=1e-3)
        assert e.device_index == 0


def test_cpu_only_profiler_has_no_device_events():
    x = torch.randn(64, 64, device="tpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(x)
    assert _device_events(prof) == []
    _no_negative(prof.key_averages())


def test_kernels_of_one_stream_do_not_overlap_and_follow_host_launch():
    x = torch.randn(64, 64, device="tpu")
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(5):
            _step(x)
    dev = sorted(_device_events(prof), key=lambda e: e.time_range.start)
    assert len(dev) >= 10
    for a, b in zip(dev, dev[1:]):
        assert a.time_range.end <= b.time_range.start + 1e-3


def _trace(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_device_time_goes_to_the_op_that_recorded_the_kernel():
    # As on CUDA, where a kernel links to the op that launched it: the deferred
    # matmul runs when the host reads it back, but its device time is aten::mm's.
    x = torch.randn(128, 128, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        with record_function("compute"):
            y = x @ x
        with record_function("read_back"):
            y.cpu()
    total = sum(e.time_range.elapsed_us() for e in _device_events(prof))
    assert total > 0
    avg = {a.key: a for a in prof.key_averages()}
    assert avg["aten::mm"].device_time_total == pytest.approx(total, rel=1e-6)
    assert avg["compute"].device_time_total == pytest.approx(total, rel=1e-6)
    assert avg["read_back"].device_time_total == 0
    _no_negative(prof.key_averages())
    text = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "TPU" in text and "-" not in text.split("\n")[3].split()[1]


def test_fused_kernel_links_to_the_first_op_it_ran(tmp_path):
    x = torch.randn(64, 64, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        y = (x * 2 + 1).tanh()
        y.cpu()
    events = _trace(prof, tmp_path)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == 1 and kernels[0]["args"]["ops"].split(",")[:2] == ["mul", "add"]
    (mul,) = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mul"]
    assert kernels[0]["args"]["External id"] == mul["args"]["External id"]
    avg = {a.key: a for a in prof.key_averages()}
    assert avg["aten::mul"].self_device_time_total > 0
    assert avg["aten::add"].device_time_total == avg["aten::tanh"].device_time_total == 0


def test_work_recorded_before_the_session_links_to_no_op():
    x = torch.randn(64, 64, device="tpu")
    torch.tpu.synchronize()
    y = x @ x  # recorded before the session, run inside it
    with profile(activities=ACTIVITIES) as prof:
        y.cpu()
    dev = _device_events(prof)
    assert len(dev) == 1
    avg = {a.key: a for a in prof.key_averages()}
    # not charged to the read-back that happened to flush it
    assert all(avg[k].device_time_total == 0 for k in avg if k.startswith("aten::"))
    _no_negative(prof.key_averages())


def test_backward_kernels_link_to_backward_ops():
    w = torch.randn(32, 32, device="tpu", requires_grad=True)
    x = torch.randn(8, 32, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        (x @ w).relu().sum().backward()
        w.grad.cpu()
    avg = {a.key: a for a in prof.key_averages()}
    total = sum(e.time_range.elapsed_us() for e in _device_events(prof))
    assert total > 0
    assert avg["aten::mm"].device_time_total > 0
    assert avg["aten::to"].device_time_total == 0
    _no_negative(prof.key_averages())


def test_stream_wait_event_is_on_the_waiting_streams_track(tmp_path):
    x = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    with profile(activities=ACTIVITIES) as prof:
        with torch.tpu.stream(s1):
            y = x @ x
            done = s1.record_event()
        with torch.tpu.stream(s2):
            s2.wait_event(done)
            z = y + 1
        s2.wait_stream(s1)
        z.cpu()
    events = _trace(prof, tmp_path)
    waits = [e for e in events if e.get("cat") == "cuda_sync"]
    assert [w["name"] for w in waits] == ["Stream Wait Event"] * 2
    for w in waits:
        assert w["ph"] == "X" and w["pid"] == 0 and w["tid"] == s2.stream_id and w["dur"] >= 0
        assert w["args"]["wait_on_stream"] == s1.stream_id
        assert w["args"]["kind"] == "stream_wait"
        assert w["args"]["External id"] >= 2**30  # its own id: paired with no op
    # the recorded matmul (the flush's host run of it shows again, later, under "tpu::kernel_mm")
    record = min((e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"), key=lambda e: e["ts"])
    mm_kernel = next(e for e in events if e.get("cat") == "kernel" and e["tid"] == s1.stream_id)
    add_kernel = next(e for e in events if e.get("cat") == "kernel" and e["tid"] == s2.stream_id)
    # s2's work starts after the wait, which ends no earlier than s1's matmul
    assert waits[0]["ts"] + waits[0]["dur"] >= mm_kernel["ts"] + mm_kernel["dur"] - 1e-3
    assert add_kernel["ts"] >= waits[0]["ts"] + waits[0]["dur"] - 1e-3
    assert record["args"]["External id"] == mm_kernel["args"]["External id"]
    # waits are device events too, charged to no op
    assert sum(1 for e in _device_events(prof) if e.name == "Stream Wait Event") == 2
    _no_negative(prof.key_averages())


def test_no_wait_events_without_the_device_activity():
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        s2.wait_stream(s1)
    assert _device_events(prof) == []


def test_key_averages_never_negative_with_backward_and_shapes():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
    x = torch.randn(8, 16, device="tpu")
    with profile(activities=ACTIVITIES, record_shapes=True, with_stack=True) as prof:
        for _ in range(2):
            loss = model(x).square().mean()
            loss.backward()
            loss.item()
    _no_negative(prof.key_averages())
    _no_negative(prof.key_averages(group_by_input_shape=True))
    assert sum(a.self_device_time_total for a in prof.key_averages()) > 0


def test_chrome_trace_has_a_device_track(tmp_path):
    x = torch.randn(64, 64, device="tpu")
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof, _tte().profile() as ours:
        _step(x)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert [k["name"] for k in kernels] == [k["name"] for k in ours.kernels]
    for k, r in zip(kernels, ours.kernels):
        assert k["ph"] == "X" and k["pid"] == 0 and k["tid"] == 0
        assert k["dur"] == pytest.approx(r["sim_time_s"] * 1e6, abs=1e-3)
        assert k["args"]["clock"] == "simulated device time"
        assert k["args"]["ops"] == ",".join(op.split(".")[0] for op in r["ops"])
    names = {(e["pid"], e["args"].get("name")) for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert (0, "tpu:0 (simulated)") in names


def test_stream_is_the_trace_thread():
    x = torch.randn(64, 64, device="tpu")
    torch.tpu.synchronize()
    s = torch.tpu.Stream()
    with profile(activities=ACTIVITIES) as prof:
        with torch.tpu.stream(s):
            (x + 1).cpu()
        (x * 3).cpu()
    dev = _device_events(prof)
    assert {e.device_resource_id for e in dev} == {0, s.stream_id}


@two_chips
def test_each_chip_is_its_own_device_track():
    a = torch.randn(64, 64, device="tpu:0")
    b = torch.randn(64, 64, device="tpu:1")
    torch.tpu.synchronize(0)
    torch.tpu.synchronize(1)
    with profile(activities=ACTIVITIES) as prof:
        (a @ a).cpu()
        (b @ b).cpu()
    assert sorted({e.device_index for e in _device_events(prof)}) == [0, 1]


def test_sessions_do_not_leak_into_each_other():
    x = torch.randn(64, 64, device="tpu")
    with profile(activities=ACTIVITIES) as p1:
        (x + 1).cpu()
    with profile(activities=ACTIVITIES) as p2:
        pass
    (x + 2).cpu()  # outside any session: recorded nowhere
    assert len(_device_events(p1)) >= 1
    assert _device_events(p2) == []


def test_schedule_cycles_each_see_their_own_kernels():
    x = torch.randn(64, 64, device="tpu")
    counts = []

    def on_ready(p):
        counts.append(len(_device_events(p)))

    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=2)
    with profile(activities=ACTIVITIES, schedule=sched, on_trace_ready=on_ready) as prof:
        for _ in range(4):
            (x + 1).cpu()
            prof.step()
    assert counts == [1, 1]


def test_failed_kernel_is_still_traced_and_device_stays_usable():
    x = torch.randn(8, 8, device="tpu")
    idx = torch.tensor([100], device="tpu") * 1  # computed on the device: checked when the op runs
    with profile(activities=ACTIVITIES) as prof:
        bad = x.index_select(0, idx)  # out of range: raises at the flush
        with pytest.raises(Exception):
            bad.cpu()
        good = (x + 1).cpu()
    torch.testing.assert_close(good, x.cpu() + 1)
    _no_negative(prof.key_averages())


# The legacy path: torch.autograd.profiler.profile(use_device="tpu"), no kineto
# device tracer (torch's KINETO_PRIVATEUSE1_FALLBACK): the profiler stubs.


def test_legacy_use_device_times_are_sane():
    x = torch.randn(128, 128, device="tpu")
    torch.tpu.synchronize()
    with torch.autograd.profiler.profile(use_device="tpu") as prof:
        y = (x @ x).sum()
        y.cpu()
    avgs = prof.key_averages()
    _no_negative(avgs)
    for a in avgs:
        assert a.cpu_time_total < 60e6  # microseconds: no garbage start times
    # The kernels run inside the read-back op: its device time is the sum of theirs.
    with _tte().profile() as ours:
        (x @ x).sum().cpu()
    expected_us = ours.total_sim_time_s * 1e6
    to = {a.key: a for a in avgs}["aten::to"]
    # torch reports the fallback's device time in whole microseconds.
    assert to.device_time_total == pytest.approx(expected_us, abs=1.0)


def test_legacy_profiler_backward_no_negative():
    w = torch.randn(16, 16, device="tpu", requires_grad=True)
    with torch.autograd.profiler.profile(use_device="tpu", record_shapes=True) as prof:
        (w @ w).sum().backward()
        w.grad.cpu()
    _no_negative(prof.key_averages())


def test_c10d_collective_is_a_device_event_linked_to_its_op(tmp_path):
    # A one-rank "tpu_ccl" group in this process (no sockets: an in-memory store).
    import torch.distributed as dist

    import torch_tpu_eager.distributed  # noqa: F401  registers tpu_ccl

    assert not dist.is_initialized()
    dist.init_process_group("tpu_ccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.ones(1024, device="tpu")
        torch.tpu.synchronize()
        with profile(activities=ACTIVITIES) as prof:
            dist.all_reduce(x)
            out = x.cpu()
        path = tmp_path / "trace.json"
        prof.export_chrome_trace(str(path))
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(out, torch.ones(1024))
    assert [e.name for e in _device_events(prof) if e.name.startswith("ici::")] == ["ici::all_reduce"]
    events = json.loads(path.read_text())["traceEvents"]
    (dev,) = [e for e in events if e.get("cat") == "kernel" and e["name"] == "ici::all_reduce"]
    (op,) = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "c10d::allreduce_"]
    assert dev["args"]["External id"] == op["args"]["External id"]
    assert (dev["args"]["bytes"], dev["args"]["group_size"]) == (4096, 1)
