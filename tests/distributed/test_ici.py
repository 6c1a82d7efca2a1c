"""Simulated interconnect (torch_tpu_eager.ici): chip data, collective cost formulas, the clock.

Expected values are computed here from the published constants (Google Cloud TPU docs,
"How to Scale Your Model") and the textbook ring formulas, never from ici's own output.
"""

import json
import math
import os

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
MiB = 2**20
ALPHA = 1e-6  # "How to Scale Your Model": ICI hop overhead "typically around 1us"
# Published per chip: bidirectional ICI GB/s and ports (Cloud TPU docs), or one-way per link (v4: scaling book).
LINK_BW = {"tpu-v5e": 400e9 / (4 * 2), "tpu-v6e": 800e9 / (4 * 2), "tpu-v5p": 1200e9 / (6 * 2), "tpu-v4": 4.5e10}
N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0
two_chips = pytest.mark.skipif(N < 2, reason="needs TORCH_TPU_NUM_DEVICES >= 2")


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _ici():
    from torch_tpu_eager import ici

    return ici


def _data(name):
    """The numbers (``params``) and interconnect facts of a chip data file, read directly."""
    import torch_tpu_eager.target as t

    with open(os.path.join(os.path.dirname(t.__file__), "targets", name + ".json")) as f:
        spec = json.load(f)
    return {**spec["params"], **spec.get("interconnect", {})}


@pytest.fixture
def on_target():
    tte = _tte()
    before = tte.get_target()

    def switch(name):
        tte.set_target(name)

    yield switch
    tte.set_target(before)


# ---------------------------------------------------------------- chip data


def test_chip_files_hold_the_published_interconnect_numbers():
    for name in TPUS:
        p = _data(name)
        for key in (
            "ici_link_bandwidth",
            "ici_links",
            "ici_hop_latency_s",
            "ici_topology",
            "ici_max_slice_shape",
            "ici_wraparound",
        ):
            assert p[key]["source"], (name, key)
        assert p["ici_link_bandwidth"]["value"] == pytest.approx(LINK_BW[name], rel=1e-12), name
        assert p["ici_hop_latency_s"]["value"] == ALPHA
    topo = {
        n: (
            _data(n)["ici_topology"]["value"],
            _data(n)["ici_links"]["value"],
            tuple(_data(n)["ici_max_slice_shape"]["value"]),
        )
        for n in TPUS
    }
    assert topo == {
        "tpu-v4": ("3d_torus", 6, (16, 16, 16)),
        "tpu-v5p": ("3d_torus", 6, (16, 16, 24)),
        "tpu-v5e": ("2d_torus", 4, (16, 16)),
        "tpu-v6e": ("2d_torus", 4, (16, 16)),
    }
    # Cloud docs cross-checks: v5e/v6e bisection bandwidth of a 16x16 torus = 2 * 16 links cut.
    assert 2 * 16 * _data("tpu-v5e")["ici_link_bandwidth"]["value"] == pytest.approx(1.6e12)
    assert 2 * 16 * _data("tpu-v6e")["ici_link_bandwidth"]["value"] == pytest.approx(3.2e12)


def test_spyre_says_it_has_no_card_interconnect():
    p = _data("spyre")["card_interconnect"]
    assert p["value"] is None and "PCIe" in p["source"]
    with pytest.raises(NotImplementedError, match="spyre"):
        _ici().collective_time("all_reduce", MiB, 2, target="spyre")


def test_target_info_carries_the_ici_numbers():
    info = _tte().target_info("tpu-v5e")
    assert info["ici_link_bandwidth"] == 50e9 and info["ici_links"] == 4
    assert "cloud.google.com/tpu/docs/v5e" in info["sources"]["ici_link_bandwidth"]


# ---------------------------------------------------------------- formulas, by hand


def test_slice_shapes_follow_the_published_slices():
    ici = _ici()
    assert [ici.slice_shape(n, "tpu-v5e") for n in (1, 4, 8, 16, 32, 64, 128, 256)] == [
        (1, 1),
        (2, 2),
        (2, 4),
        (4, 4),
        (4, 8),
        (8, 8),
        (8, 16),
        (16, 16),
    ]
    assert [ici.slice_shape(n, "tpu-v4") for n in (4, 8, 16, 32, 64, 128, 256, 4096)] == [
        (1, 2, 2),
        (2, 2, 2),
        (2, 2, 4),
        (2, 4, 4),
        (4, 4, 4),
        (4, 4, 8),
        (4, 8, 8),
        (16, 16, 16),
    ]
    assert ici.slice_shape(6144, "tpu-v5p") == (16, 16, 24)
    assert ici.slice_shape(17, "tpu-v5e") == (17,)  # no rectangle fits: a path


@pytest.mark.parametrize("name", TPUS)
def test_two_chip_ring_matches_the_textbook_formulas(name):
    ici, b, B = _ici(), LINK_BW[name], 64 * MiB
    n = 2
    # Ring (Thakur et al. 2005; Patarasuk & Yuan 2009) on one link used in both directions.
    assert ici.collective_time("all_reduce", B, n, name) == pytest.approx(2 * (n - 1) / n * B / b + 2 * (n - 1) * ALPHA)
    assert ici.collective_time("all_gather", B, n, name) == pytest.approx((n - 1) / n * B / b + (n - 1) * ALPHA)
    assert ici.collective_time("reduce_scatter", B, n, name) == pytest.approx((n - 1) / n * B / b + (n - 1) * ALPHA)
    assert ici.collective_time("broadcast", B, n, name) == pytest.approx(B / b + ALPHA)
    assert ici.collective_time("send", B, n, name) == pytest.approx(B / b + ALPHA)
    assert ici.collective_time("barrier", 123, n, name) == pytest.approx(2 * ALPHA)
    c = ici.collective_cost("all_reduce", B, n, name)
    assert c.algorithm == "ring" and c.hops == 2 and c.bytes_per_link == pytest.approx(B)
    assert c.bandwidth_s == pytest.approx(2 * (n - 1) / n * B / b)
    assert c.bus_bandwidth == pytest.approx(2 * (n - 1) / n * B / c.time_s)


def test_v5e_full_pod_all_reduce_is_the_2d_torus_algorithm():
    ici, b, B = _ici(), LINK_BW["tpu-v5e"], 256 * MiB
    c = ici.collective_cost("all_reduce", B, 256, "tpu-v5e")
    assert (c.algorithm, c.shape, c.wraparound) == ("torus", (16, 16), (True, True))
    # Two halves, each reduce-scatters along one axis then the other (bidirectional rings, 2b),
    # then all-gathers back: 2 * [15a + 15/16*(B/2)/2b + 15a + 15/16*(B/32)/2b].
    rs = 15 * ALPHA + 15 / 16 * (B / 2) / (2 * b) + 15 * ALPHA + 15 / 16 * (B / 32) / (2 * b)
    assert c.time_s == pytest.approx(2 * rs)
    assert c.hops == 60
    # One bidirectional ring through all 256 chips would take:
    ring = 2 * 255 * ALPHA + 2 * 255 / 256 * B / (2 * b)
    assert c.time_s < 0.6 * ring


def test_v4_cube_all_reduce_uses_three_wrapped_axes():
    ici, b, B = _ici(), LINK_BW["tpu-v4"], 96 * MiB
    c = ici.collective_cost("all_reduce", B, 64, "tpu-v4")
    assert (c.algorithm, c.shape, c.wraparound) == ("torus", (4, 4, 4), (True, True, True))
    rs = sum(3 * ALPHA + 3 / 4 * (B / 3) / 4**p / (2 * b) for p in range(3))
    assert c.time_s == pytest.approx(2 * rs)
    # 2x2x2 has no wraparound (no full cube): each axis is one link used both ways.
    c8 = ici.collective_cost("all_reduce", B, 8, "tpu-v4")
    assert c8.wraparound == (False, False, False) and c8.algorithm == "torus"
    rs8 = sum(ALPHA + 1 / 2 * (B / 3) / 2**p / b for p in range(3))
    assert c8.time_s == pytest.approx(2 * rs8)


def test_v5e_8_chips_use_one_bidirectional_ring_round_the_2x4_mesh():
    ici, b, B = _ici(), LINK_BW["tpu-v5e"], 64 * MiB
    c = ici.collective_cost("all_reduce", B, 8, "tpu-v5e")
    assert (c.algorithm, c.shape, c.wraparound) == ("bidirectional_ring", (2, 4), (False, False))
    assert c.time_s == pytest.approx(2 * 7 * ALPHA + 2 * 7 / 8 * B / (2 * b))


def test_all_to_all_is_limited_by_the_busiest_link():
    ici, b, B = _ici(), LINK_BW["tpu-v6e"], 32 * MiB
    c = ici.collective_cost("all_to_all", B, 256, "tpu-v6e")
    # Each chip sends B/16 to each axis offset; a 16-ring with wraparound carries 16^2/8 of them per link.
    assert c.bandwidth_s == pytest.approx(B / 16 * 16**2 / 8 / b)
    assert c.hops == 16 and c.algorithm == "direct"
    c2 = ici.collective_cost("all_to_all", B, 2, "tpu-v6e")
    assert c2.time_s == pytest.approx(ALPHA + B / 2 / b)


def test_aliases_of_c10d_names():
    ici = _ici()
    for alias, op in (
        ("allreduce", "all_reduce"),
        ("all_gather_into_tensor", "all_gather"),
        ("reduce_scatter_tensor", "reduce_scatter"),
        ("all_to_all_single", "all_to_all"),
        ("isend", "send"),
    ):
        assert ici.collective_cost(alias, MiB, 4, "tpu-v5e") == ici.collective_cost(op, MiB, 4, "tpu-v5e")


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("name", TPUS)
def test_time_grows_with_bytes_and_bandwidth_term_is_linear(name):
    ici = _ici()
    for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send"):
        for n in (2, 4, 8, 64):
            costs = [ici.collective_cost(op, s * MiB, n, name) for s in (0, 1, 4, 16, 64, 256)]
            times = [c.time_s for c in costs]
            assert all(a < b for a, b in zip(times, times[1:])), (op, n, times)
            assert costs[0].bandwidth_s == 0 and costs[0].latency_s > 0
            # For one algorithm (the choice may change with size: fewer hops win on small
            # buffers), latency does not depend on size and the bandwidth term is proportional to it.
            by_algorithm = {}
            for s, c in zip((0, 1, 4, 16, 64, 256), costs):
                by_algorithm.setdefault(c.algorithm, []).append((s, c))
            for algorithm, group in by_algorithm.items():
                assert len({c.latency_s for _, c in group}) == 1, (op, n, algorithm)
                (s0, c0), (s1, c1) = group[0], group[-1]
                if s0:
                    assert c1.bandwidth_s * s0 == pytest.approx(c0.bandwidth_s * s1), (op, n, algorithm)
            assert costs[-1].algorithm == costs[-2].algorithm


def test_large_all_reduce_bus_bandwidth_tends_to_the_ring_bandwidth():
    ici = _ici()
    for name in TPUS:
        b = LINK_BW[name]
        c = ici.collective_cost("all_reduce", 2**34, 2, name)
        # A 2-chip ring: bandwidth term 2(n-1)/n * B / b, so bus bandwidth -> b as B grows.
        assert c.bus_bandwidth == pytest.approx(b, rel=1e-3)
        assert c.bus_bandwidth < b


def test_torus_beats_the_ring_for_large_groups_not_small_messages_alone():
    ici = _ici()
    for name, n in (("tpu-v5e", 256), ("tpu-v6e", 256), ("tpu-v4", 4096), ("tpu-v5p", 6144)):
        for size in (4 * 1024, 256 * MiB):
            assert ici.collective_cost("all_reduce", size, n, name).algorithm == "torus", (name, n, size)
    # More chips on a full torus: latency grows with the axes, not with the chip count.
    small, big = (ici.collective_cost("all_reduce", 0, n, "tpu-v4") for n in (64, 4096))
    assert big.hops == 2 * 3 * 15 and small.hops == 2 * 3 * 3


def test_one_chip_costs_nothing():
    ici = _ici()
    for op in ici.OPS:
        c = ici.collective_cost(op, MiB, 1, "tpu-v5e")
        assert (c.time_s, c.algorithm, c.hops) == (0.0, "none", 0)


def test_default_target_is_the_active_one(on_target):
    ici = _ici()
    on_target("tpu-v6e")
    assert ici.collective_time("all_reduce", MiB, 4) == ici.collective_time("all_reduce", MiB, 4, "tpu-v6e")


# ---------------------------------------------------------------- bad input


def test_bad_input_raises():
    ici = _ici()
    with pytest.raises(ValueError, match="all_sum"):
        ici.collective_time("all_sum", MiB, 2)
    with pytest.raises(ValueError, match="unknown collective"):
        ici.collective_time(None, MiB, 2)
    with pytest.raises(ValueError, match="nbytes"):
        ici.collective_time("all_reduce", -1, 2)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="group_size"):
            ici.collective_time("all_reduce", MiB, bad)
    with pytest.raises(ValueError, match="257"):
        ici.collective_time("all_reduce", MiB, 257, "tpu-v5e")
    with pytest.raises(ValueError, match="6145"):
        ici.collective_time("all_reduce", MiB, 6145, "tpu-v5p")
    assert ici.collective_time("all_reduce", MiB, 6144, "tpu-v5p") > 0
    with pytest.raises(ValueError, match="tpu-v9"):
        ici.collective_time("all_reduce", MiB, 2, "tpu-v9")
    for bad in (1.5, "1", True):
        with pytest.raises(TypeError):
            ici.collective_time("all_reduce", bad, 2)
        with pytest.raises(TypeError):
            ici.collective_time("all_reduce", MiB, bad)


# ---------------------------------------------------------------- the simulated clock


def _events():
    return torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)


def test_event_pair_measures_the_collective(on_target):
    on_target("tpu-v5e")
    ici = _ici()
    torch.tpu.synchronize()
    start, end = _events()
    start.record()
    cost = ici.record_collective("all_reduce", 64 * MiB, 8, "tpu:0")
    end.record()
    assert cost.time_s == ici.collective_time("all_reduce", 64 * MiB, 8)
    assert start.elapsed_time(end) == pytest.approx(cost.time_s * 1e3, rel=1e-9)


def test_collective_follows_pending_work_on_the_timeline(on_target):
    on_target("tpu-v5e")
    tte, ici = _tte(), _ici()
    x = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    before = tte.metrics()
    start, end = _events()
    with tte.profile() as prof:
        start.record()
        y = x @ x  # pending when the collective is recorded
        cost = ici.record_collective("all_gather", 4 * MiB, 4)
        end.record()
    after = tte.metrics()
    kinds = [k["kind"] for k in prof.kernels]
    assert kinds == ["kernel", "collective"], kinds
    kernel, coll = prof.kernels
    assert coll["name"] == "all_gather" and coll["sim_time_s"] == cost.time_s
    assert coll["start_s"] == pytest.approx(kernel["start_s"] + kernel["sim_time_s"])
    assert coll["collective"]["algorithm"] == cost.algorithm and coll["collective"]["hops"] == cost.hops
    assert coll["collective"]["shape"] == cost.shape
    assert start.elapsed_time(end) == pytest.approx((kernel["sim_time_s"] + cost.time_s) * 1e3, rel=1e-9)
    assert after["flush_reasons"].get("collective", 0) == before["flush_reasons"].get("collective", 0) + 1
    assert after["collectives"] == before["collectives"] + 1
    assert after["collective_time_s"] - before["collective_time_s"] == pytest.approx(cost.time_s)
    assert after["sim_time_s"] - before["sim_time_s"] == pytest.approx(kernel["sim_time_s"] + cost.time_s)
    assert torch.equal(y.cpu(), x.cpu() @ x.cpu())
    assert "ici" in prof.table(file=None)


def test_collective_on_another_stream_overlaps_compute(on_target):
    on_target("tpu-v5e")
    ici = _ici()
    torch.tpu.synchronize()
    side = torch.tpu.Stream()
    start, end = _events()
    start.record()
    side.wait_event(start)  # the side stream starts where the default stream is
    with torch.tpu.stream(side):
        s0, s1 = _events()
        s0.record()
        cost = ici.record_collective("reduce_scatter", 16 * MiB, 4)
        s1.record()
    end.record()
    assert start.elapsed_time(end) == 0.0  # the default stream did not wait for it
    assert s0.elapsed_time(s1) == pytest.approx(cost.time_s * 1e3, rel=1e-9)
    torch.tpu.current_stream().wait_event(s1)  # joining the streams waits for it
    joined = torch.tpu.Event(enable_timing=True)
    joined.record()
    assert start.elapsed_time(joined) == pytest.approx(cost.time_s * 1e3, rel=1e-9)


@two_chips
def test_collective_is_charged_to_the_recording_chip_only(on_target):
    on_target("tpu-v5e")
    tte, ici = _tte(), _ici()
    torch.tpu.synchronize()
    t0, t1 = tte._C._chip_sim_time(0), tte._C._chip_sim_time(1)
    cost = ici.record_collective("broadcast", MiB, 2, device=1)
    assert tte._C._chip_sim_time(1) == pytest.approx(t1 + cost.time_s)
    assert tte._C._chip_sim_time(0) == t0


def test_chrome_trace_puts_collectives_on_their_own_track(on_target, tmp_path):
    on_target("tpu-v5e")
    tte, ici = _tte(), _ici()
    with tte.profile() as prof:
        ici.record_collective("all_reduce", MiB, 4)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    coll = [e for e in events if e.get("cat") == "collective"]
    assert len(coll) == 1 and coll[0]["tid"] == 1 and coll[0]["name"] == "all_reduce"
    assert coll[0]["args"]["algorithm"] == "torus"


def test_spyre_target_charges_nothing(on_target):
    on_target("spyre")
    tte, ici = _tte(), _ici()
    torch.tpu.synchronize()
    before = tte.metrics()["collectives"]
    assert ici.record_collective("all_reduce", MiB, 2) is None
    assert tte.metrics()["collectives"] == before
    with pytest.raises(ValueError, match="all_sum"):
        ici.record_collective("all_sum", MiB, 2)


def test_record_collective_bad_input_charges_nothing(on_target):
    on_target("tpu-v5e")
    tte, ici = _tte(), _ici()
    before = tte.metrics()["collectives"]
    with pytest.raises(ValueError):
        ici.record_collective("all_reduce", -1, 2)
    with pytest.raises(ValueError):
        ici.record_collective("all_reduce", MiB, 2, device="cpu")
    with pytest.raises(ValueError, match="257"):
        ici.record_collective("all_reduce", MiB, 257)
    assert tte.metrics()["collectives"] == before
    assert math.isfinite(tte.metrics()["sim_time_s"])


# ---------------------------------------------------------------- torch.profiler (kineto)


def _kineto_profile():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])


def _device_events(prof):
    from torch.autograd import DeviceType

    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def test_torch_profiler_shows_the_collective_on_the_device_track(on_target, tmp_path):
    on_target("tpu-v5e")
    ici, n, B = _ici(), 2, 64 * MiB
    expected_s = 2 * (n - 1) / n * B / LINK_BW["tpu-v5e"] + 2 * (n - 1) * ALPHA  # two-chip ring all_reduce
    torch.tpu.synchronize()
    with _kineto_profile() as prof:
        cost = ici.record_collective("all_reduce", B, n)
    assert cost.time_s == pytest.approx(expected_s)
    (ev,) = _device_events(prof)
    assert ev.name == "ici::all_reduce" and ev.device_index == 0 and ev.device_resource_id == 0
    assert ev.time_range.elapsed_us() == pytest.approx(expected_s * 1e6, abs=1e-3)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    (dev,) = [e for e in events if e.get("cat") == "kernel"]
    assert dev["name"] == "ici::all_reduce" and dev["ph"] == "X" and (dev["pid"], dev["tid"]) == (0, 0)
    assert dev["dur"] == pytest.approx(expected_s * 1e6, abs=1e-3)
    args = dev["args"]
    assert (args["kind"], args["algorithm"], args["bytes"], args["group_size"]) == ("collective", "ring", B, n)
    assert args["clock"] == "simulated device time"
    # Linked to the host range of the same name, which encloses its issue.
    (host,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "ici::all_reduce"]
    assert args["External id"] == host["args"]["External id"]
    # The device track is on the simulated clock, anchored at the session's start: the chip's
    # first device event lies there, before the host range that issued it.
    (session,) = [e for e in events if e.get("cat") == "Trace" and e["name"].startswith("PyTorch Profiler")]
    assert session["ts"] <= dev["ts"] <= host["ts"]


def test_torch_profiler_collective_follows_the_streams_pending_kernels(on_target):
    on_target("tpu-v5e")
    ici = _ici()
    x = torch.randn(128, 128, device="tpu")
    torch.tpu.synchronize()
    with _kineto_profile() as prof:
        y = x @ x  # pending: runs before the collective, on the same track
        cost = ici.record_collective("all_gather", 4 * MiB, 4)
    dev = sorted(_device_events(prof), key=lambda e: e.time_range.start)
    assert [e.name for e in dev][-1] == "ici::all_gather" and len(dev) == 2
    kernel, coll = dev
    assert coll.time_range.start >= kernel.time_range.end - 1e-3
    assert coll.time_range.elapsed_us() == pytest.approx(cost.time_s * 1e6, abs=1e-3)
    assert {e.device_resource_id for e in dev} == {0}
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


def test_torch_profiler_collective_on_a_side_stream_overlaps_compute(on_target):
    on_target("tpu-v5e")
    ici = _ici()
    x = torch.randn(128, 128, device="tpu")
    torch.tpu.synchronize()
    side = torch.tpu.Stream()
    with _kineto_profile() as prof:
        with torch.tpu.stream(side):
            # 1 TiB: tens of simulated seconds, far longer than the host takes to issue the matmul.
            cost = ici.record_collective("all_reduce", 2**40, 2)
        y = (x @ x).cpu()
    dev = _device_events(prof)
    (coll,) = [e for e in dev if e.name == "ici::all_reduce"]
    kernels = [e for e in dev if e.name != "ici::all_reduce"]
    assert coll.device_resource_id == side.stream_id and coll.device_index == 0
    assert coll.time_range.elapsed_us() == pytest.approx(cost.time_s * 1e6, rel=1e-9)
    assert kernels and {k.device_resource_id for k in kernels} == {0}
    for k in kernels:  # the default stream's kernels run while the side stream's collective does
        assert coll.time_range.start <= k.time_range.start and k.time_range.end <= coll.time_range.end
    torch.testing.assert_close(y, x.cpu() @ x.cpu())


def _trace_events(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_torch_profiler_device_tracks_follow_the_simulated_clock(on_target, tmp_path):
    # An async collective on a side stream, independent compute on the default stream, then
    # the default stream waits for the collective: the trace's device tracks show what the
    # simulated clocks say (Event pairs measure the same), not when the host issued the work.
    on_target("tpu-v5e")
    tte, ici = _tte(), _ici()
    n, B = 2, 4 * MiB
    expected_s = 2 * (n - 1) / n * B / LINK_BW["tpu-v5e"] + 2 * (n - 1) * ALPHA  # two-chip ring all_reduce
    a_cpu = torch.randn(256, 256) / 16
    a = a_cpu.to("tpu")
    torch.tpu.synchronize()
    main, side = torch.tpu.current_stream(), torch.tpu.Stream()
    start, end = _events()
    before = tte.metrics()
    with _kineto_profile() as prof:
        start.record()
        side.wait_stream(main)  # the collective starts where the default stream is
        with torch.tpu.stream(side):
            cost = ici.record_collective("all_reduce", B, n)
        y = a
        for _ in range(4):  # 4 kernels of ~3 us: far shorter than the collective
            y = torch.tanh(y @ a)
            main.synchronize()  # run it now: one kernel each
        main.wait_stream(side)
        z = y * 2
        main.synchronize()
        end.record()
    after = tte.metrics()
    torch.testing.assert_close(z.cpu(), 2 * _tanh_chain(a_cpu, 4), rtol=1e-5, atol=1e-6)
    events = _trace_events(prof, tmp_path)
    dev = [e for e in events if e.get("cat") == "kernel"]
    (coll,) = [e for e in dev if e["name"] == "ici::all_reduce"]
    compute = sorted((e for e in dev if e["tid"] == main.stream_id), key=lambda e: e["ts"])
    waits = [e for e in events if e.get("cat") == "cuda_sync" and e["tid"] == main.stream_id]
    assert coll["tid"] == side.stream_id and len(compute) == 5 and len(waits) == 1, (coll, compute, waits)
    assert cost.time_s == pytest.approx(expected_s)
    assert coll["dur"] == pytest.approx(expected_s * 1e6, abs=1e-3)  # the cost model's time
    c0, c1 = coll["ts"], coll["ts"] + coll["dur"]
    ns = 3e-3  # us: the trace's ts are whole ns, and a 1 ns wait shifts its stream's next event
    # the independent compute overlaps the collective: it starts with it, on the other track
    first, *_, last_before, after_wait = compute
    assert first["ts"] == pytest.approx(c0, abs=ns)
    assert last_before["ts"] + last_before["dur"] < c1
    # serial dependencies do not overlap: one stream's kernels follow each other; the wait
    # ends with the collective; the kernel after it starts there
    for p, q in zip(compute, compute[1:]):
        assert p["ts"] + p["dur"] <= q["ts"] + ns
    (wait,) = waits
    assert wait["ts"] == pytest.approx(last_before["ts"] + last_before["dur"], abs=ns)
    assert wait["ts"] + wait["dur"] == pytest.approx(c1, abs=ns)
    assert after_wait["ts"] == pytest.approx(c1, abs=ns)
    # the kernels last their simulated time; start to end is what the Event pair measures
    kernels_s = (after["sim_time_s"] - after["collective_time_s"]) - (
        before["sim_time_s"] - before["collective_time_s"]
    )
    assert sum(e["dur"] for e in compute) == pytest.approx(kernels_s * 1e6, abs=5e-3)
    span_us = after_wait["ts"] + after_wait["dur"] - first["ts"]
    assert span_us == pytest.approx(start.elapsed_time(end) * 1e3, abs=5e-3)
    assert span_us == pytest.approx((expected_s * 1e6) + after_wait["dur"], abs=5e-3)


def _tanh_chain(a, reps):
    y = a
    for _ in range(reps):
        y = torch.tanh(y @ a)
    return y


@two_chips
def test_torch_profiler_collective_is_on_its_chips_track(on_target):
    on_target("tpu-v5e")
    ici = _ici()
    torch.tpu.synchronize()
    with _kineto_profile() as prof:
        ici.record_collective("broadcast", MiB, 2, device=1)
    (ev,) = _device_events(prof)
    assert ev.name == "ici::broadcast" and ev.device_index == 1


def test_torch_profiler_spyre_collective_is_no_device_event(on_target):
    on_target("spyre")
    with _kineto_profile() as prof:
        assert _ici().record_collective("all_reduce", MiB, 2) is None
    assert _device_events(prof) == []


def test_collective_outside_a_torch_profiler_session_is_recorded_nowhere(on_target):
    on_target("tpu-v5e")
    ici = _ici()
    with _kineto_profile() as p1:
        pass
    ici.record_collective("all_reduce", MiB, 2)
    with _kineto_profile() as p2:
        pass
    assert _device_events(p1) == _device_events(p2) == []
