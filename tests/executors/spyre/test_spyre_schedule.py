"""The Spyre target's dataflow schedule (issue 6, item 4): per core a double-buffered
load -> compute -> store pipeline over tiles that fit the usable LX, the corelet split,
ring reductions across the core-split dim. Tile rules are re-derived here from
docs/spyre.md, independently of the C++ tiler.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftest import requires_tpu

pytestmark = requires_tpu


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _info():
    return _tte().target_info("spyre")


def _one_schedule():
    from torch_tpu_eager import spyre

    (s,) = spyre.last_schedule()
    return s


# Independent reference of the documented tiling rule for views of shape [R, C] that all
# split over the cores: a core's share is ceil(R / cores) rows of ceil(C / stick_elems)
# sticks; n tiles hold ceil(rows / n) whole rows while n <= rows, else ceil(sticks / n)
# sticks; n is the fewest tiles (>= 2 when the share has 2+ sticks) whose 2 buffers fit.
def _ref_tiles(rows, cols, itemsize, n_views, info):
    stick = info["stick_bytes"]
    budget = info["lx_usable_bytes_per_core"]
    rpc = math.ceil(rows / info["cores"])
    row_sticks = math.ceil(cols / (stick // itemsize))
    share = rpc * row_sticks

    def tile_sticks(n):
        return math.ceil(rpc / n) * row_sticks if n <= rpc else math.ceil(share / n)

    n = 2 if share >= 2 else 1
    while 2 * n_views * tile_sticks(n) * stick > budget:
        n += 1
    return n, tile_sticks(n), rpc, row_sticks


def _df16_sum(x, y, dtype):
    """Spyre's x + y for 16-bit x, y: f32 sum of the df16 inputs, rounded once to df16."""
    from torch_tpu_eager import spyre

    xs, ys = (spyre.df16_round(t).float() for t in (x, y))
    return spyre.df16_round(xs + ys).to(dtype)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(1, 200),
    cols=st.integers(1, 70000),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_tiles_fit_lx_and_cover_the_share(spyre_target, rows, cols, dtype):

    info = _info()
    x = torch.randn(rows, cols).to(dtype)
    y = torch.randn(rows, cols).to(dtype)
    z = x.to("tpu") + y.to("tpu")
    s = _one_schedule()
    want = x + y if dtype == torch.float32 else _df16_sum(x, y, dtype)
    assert torch.equal(z.cpu(), want)
    n, tile_sticks, rpc, row_sticks = _ref_tiles(rows, cols, 4 if dtype == torch.float32 else 2, 3, info)
    assert s["buffers"] == 2
    assert s["lx_bytes_used"] == 2 * sum(v["tile_bytes"] for v in s["views"])
    assert s["lx_bytes_used"] <= info["lx_usable_bytes_per_core"]
    assert s["n_tiles"] == n
    for v in s["views"]:
        assert v["tile_bytes"] == v["tile_sticks"] * info["stick_bytes"]
        assert v["tile_sticks"] == tile_sticks
    # Never truncated: the tiles cover the core's whole share.
    assert s["n_tiles"] * tile_sticks >= rpc * row_sticks
    assert s["row_split"] == (n > rpc)


def test_16bit_add_matches_df16_rounded_cpu(spyre_target):

    x, y = torch.randn(40, 300).half(), torch.randn(40, 300).half()
    got = (x.to("tpu") + y.to("tpu")).cpu()
    assert torch.equal(got, _df16_sum(x, y, torch.float16))


def test_big_row_is_retiled_into_sticks_not_truncated(spyre_target):
    info = _info()
    x = torch.randn(2, 300000)  # one float32 row is 1.2 MB: more than the usable LX
    y = torch.neg(x.to("tpu"))
    assert torch.equal(y.cpu(), -x)
    s = _one_schedule()
    assert s["row_split"] and s["tile_rows"] == 0
    row_sticks = math.ceil(300000 / 32)
    for v in s["views"]:
        assert v["tile_sticks"] * s["n_tiles"] >= row_sticks
        assert v["tile_sizes"] == [1, v["tile_sticks"] * 32]
    assert s["lx_bytes_used"] <= info["lx_usable_bytes_per_core"]
    assert s["corelet_split"] == "sticks"


def test_region_that_cannot_fit_one_stick_raises_and_leaves_other_tensors_valid(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import _C

    info = _info()
    ok = torch.arange(6.0).to("tpu") * 2
    assert torch.equal(ok.cpu(), torch.arange(6.0) * 2)
    params = {
        "name": "spyre",
        "cores": info["cores"],
        "corelets_per_core": info["corelets_per_core"],
        "lx_bytes_per_core": info["lx_bytes_per_core"],
        "lx_usable_bytes_per_core": 256,
        "dram_bytes": int(info["dram_bytes"]),
        "stick_bytes": info["stick_bytes"],
        "matmul_macs_per_s_per_core": info["matmul_sustained_mac_per_ns_per_core"] * 1e9,
        "vector_elems_per_s_per_core": info["vector_elems_per_us_per_core"] * 1e6,
        "dram_bandwidth": info["dram_bandwidth_mixed"],
        "overlap": info["overlap_factor"],
    }
    _C._set_spyre_target(params)  # 256 bytes: not even 2 buffers x 2 views x one stick
    try:
        bad = torch.neg(ok)
        with pytest.raises(ValueError, match="cannot be tiled to fit LX"):
            bad.cpu()
        assert torch.equal(ok.cpu(), torch.arange(6.0) * 2)
    finally:
        tte.set_target("spyre")
    assert torch.equal((ok + 1).cpu(), torch.arange(6.0) * 2 + 1)


def test_double_buffered_stage_order(spyre_target):
    x = torch.randn(64 * 32, 2048)  # 64 rows of 8 KB per core: several tiles
    y = torch.exp(x.to("tpu"))
    assert torch.allclose(y.cpu(), torch.exp(x))
    s = _one_schedule()
    n = s["n_tiles"]
    assert n >= 4
    by = {(st["kind"], st["tile"]): st for st in s["stages"]}
    for i in (0, 1, 2, n - 1):
        ld, cp, sr = by[("load", i)], by[("compute", i)], by[("store", i)]
        assert ld["buffer"] == cp["buffer"] == sr["buffer"] == i % 2
        assert ld["end_s"] <= cp["start_s"] + 1e-18 and cp["end_s"] <= sr["start_s"] + 1e-18
    # The load of tile 1 overlaps the compute of tile 0 (other buffer).
    assert by[("load", 1)]["start_s"] < by[("compute", 0)]["end_s"]
    # Tile 2 reuses buffer 0: its load starts after tile 0 is stored.
    assert by[("load", 2)]["start_s"] >= by[("store", 0)]["end_s"] - 1e-18
    assert s["stages_omitted"] == 3 * (n - 4)
    starts = [st["start_s"] for st in s["stages"]]
    assert starts == sorted(starts)
    assert {st["kind"] for st in s["stages"]} == {"load", "compute", "store"}
    # Fill + steady + drain; overlap makes it shorter than C + M, never shorter than max(C, M).
    assert s["pipelined_s"] == pytest.approx(s["fill_s"] + s["steady_s"] + s["drain_s"], rel=1e-12)
    assert s["pipelined_s"] == pytest.approx(by[("store", n - 1)]["end_s"], rel=1e-12)
    c, m = s["compute_s"], s["memory_s"]
    assert max(c, m) <= s["pipelined_s"] < c + m


def test_single_tile_does_not_overlap(spyre_target):
    x = torch.tensor([1.0, 2.0, 3.0])
    y = (x.to("tpu") * 3).cpu()
    assert torch.equal(y, x * 3)
    s = _one_schedule()
    assert s["n_tiles"] == 1
    assert s["pipelined_s"] == pytest.approx(s["compute_s"] + s["memory_s"], rel=1e-12)


def test_corelets_split_each_tile(spyre_target):
    info = _info()
    x = torch.randn(32 * 40, 64)
    y = torch.relu(x.to("tpu"))
    assert torch.equal(y.cpu(), torch.relu(x))
    s = _one_schedule()
    assert s["corelets"] == info["corelets_per_core"] == 2
    assert s["corelet_split"] == "rows"
    assert len(s["corelet_share"]) == 2 and sum(s["corelet_share"]) == s["tile_rows"]
    assert max(s["corelet_share"]) - min(s["corelet_share"]) <= 1
    assert s["cores_used"] == 32 and s["rows_per_core"] == 40


@pytest.mark.parametrize("corelets", [1, 2, 3, 4, 7])
def test_corelet_shares_split_rows_in_order(corelets):
    # The ring's corelet split (docs/ktir.md, "Ring reductions"; one helper
    # for softmax's native partials and both ring loops): the shares sum to
    # the rows, differ by at most 1, the larger ones first, i.e. the first
    # rows % corelets corelets take one row more than rows // corelets.
    from torch_tpu_eager import _C

    for rows in [*range(0, 40), 999, 1000, 1001]:
        want = [rows // corelets + (1 if j < rows % corelets else 0) for j in range(corelets)]
        got = _C._corelet_shares(rows, corelets)
        assert got == want, (rows, got)
        assert sum(got) == rows and max(got) - min(got) <= 1 and got == sorted(got, reverse=True)
    if corelets == 2:  # the docs' words: corelet 0 takes ceil(n / 2) of n rows
        assert [_C._corelet_shares(n, 2)[0] for n in range(9)] == [math.ceil(n / 2) for n in range(9)]


@pytest.mark.parametrize("rows, corelets", [(4, 0), (4, -1), (-1, 2)])
def test_corelet_shares_bad_arguments_raise_value_error(rows, corelets):
    from torch_tpu_eager import _C

    with pytest.raises(ValueError, match="corelet_shares"):
        _C._corelet_shares(rows, corelets)


def test_full_reduction_has_a_ring_reduce(spyre_target):
    x = torch.randn(64, 100)
    got = x.to("tpu").sum()
    assert torch.allclose(got.cpu(), x.sum(), rtol=1e-5)
    s = _one_schedule()
    assert s["cores_used"] == 32 and s["rows_per_core"] == 2
    assert s["ring_steps"] == 31
    assert s["partial_bytes"] == 128  # one float32 partial per core, padded to a stick
    assert s["ring_bytes"] == 31 * 128 and s["ring_cycles"] == 31
    assert s["stages"][-1]["kind"] == "ring_reduce" and s["stages"][-1]["bytes"] == 31 * 128
    from torch_tpu_eager import spyre

    assert "reduce=ring" in spyre.dump_ktir()
    assert "ring_reduce steps=31 bytes=3968" in spyre.dump_schedule()


def test_column_reduction_has_a_ring_reduce_of_a_row(spyre_target):
    x = torch.randn(96, 40)
    got = x.to("tpu").sum(dim=0)
    assert torch.allclose(got.cpu(), x.sum(dim=0), rtol=1e-5, atol=1e-5)
    s = _one_schedule()
    assert s["cores_used"] == 32 and s["ring_steps"] == 31
    assert s["partial_bytes"] == 2 * 128  # 40 float32 = 160 bytes: two sticks


def test_row_wise_reduction_has_no_ring_reduce(spyre_target):
    x = torch.randn(64, 100)
    got = torch.softmax(x.to("tpu"), dim=-1).sum(dim=-1)
    assert torch.allclose(got.cpu(), torch.softmax(x, dim=-1).sum(dim=-1), rtol=1e-5)
    for s in _tte().spyre.last_schedule():
        assert s["ring_steps"] == 0
        assert all(st["kind"] != "ring_reduce" for st in s["stages"])


def test_schedule_time_relates_to_the_calibrated_law(spyre_target):
    info = _info()
    a, b = torch.randn(512, 1024), torch.randn(1024, 768)
    with _tte().profile() as prof:
        c = (a.to("tpu") @ b.to("tpu")).cpu()
    assert torch.allclose(c, a @ b, rtol=1e-4, atol=1e-3)
    (kern,) = [k for k in prof.kernels if "mm" in k["name"]]
    s = _one_schedule()
    cc, mm = s["compute_s"], s["memory_s"]
    assert (cc, mm) == (kern["compute_s"], kern["memory_s"])
    assert s["calibrated_s"] == pytest.approx(kern["sim_time_s"], rel=1e-12)
    assert s["calibrated_s"] == pytest.approx(cc + mm - info["overlap_factor"] * min(cc, mm), rel=1e-12)
    # The replicated right operand (3 MB) streams through LX in slices.
    assert s["n_tiles"] > 1 and s["lx_bytes_used"] <= info["lx_usable_bytes_per_core"]
    assert max(cc, mm) <= s["pipelined_s"] <= s["calibrated_s"]


def test_dump_schedule_unknown_format_raises():
    from torch_tpu_eager import spyre

    with pytest.raises(ValueError, match="format"):
        spyre.dump_schedule(format="json")
