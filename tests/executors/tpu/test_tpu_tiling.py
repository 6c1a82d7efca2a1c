"""Simulated TPU: VMEM tiling plans, convolution costing, torch.profiler ranges.

Expected numbers come from the chip data files and rules written here: tiles of
(8,128) 32-bit / (16,128) 16-bit / (32,128) 8-bit, double-buffered blocks, a
Pallas pipeline that fetches a block again only when its block index changes
(simulated step by step below), implicit-GEMM shapes of convolutions.
"""

import json
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftest import requires_tpu

pytestmark = [requires_tpu, pytest.mark.usefixtures("restore_target_and_precision")]

TPU_TARGETS = ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"]


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def chip(name):
    path = os.path.join(os.path.dirname(_tte().__file__), "targets", name + ".json")
    with open(path) as f:
        return {k: p["value"] for k, p in json.load(f)["params"].items()}


def round_up(x, m):
    return -(-x // m) * m


def sub_tile(itemsize):
    return 8 * max(1, 4 // itemsize)


def block_bytes(rows, cols, itemsize):
    """VMEM bytes of a (rows, cols) block padded to whole (sublane tile, 128) tiles."""
    return round_up(rows, sub_tile(itemsize)) * round_up(cols, 128) * itemsize


def item(dtype):
    return torch.empty((), dtype=dtype).element_size()


def profiled(fn):
    torch.tpu.synchronize()
    with _tte().profile() as prof:
        out = fn()
        torch.tpu.synchronize()
    return prof, out


def only_kernel(prof, *op_names):
    ks = [k for k in prof.kernels if any(o.split(".")[0] in op_names for o in k["ops"])]
    assert len(ks) == 1, [k["ops"] for k in prof.kernels]
    return ks[0]


def simulated_fetches(grid_m, grid_n, grid_k, order):
    """Blocks of lhs and rhs fetched by a pipeline that walks the grid in `order`
    (k innermost) and fetches an operand's block only when its index changes."""
    outer, inner = (grid_m, grid_n) if order == "mnk" else (grid_n, grid_m)
    a_prev = b_prev = None
    a = b = 0
    for o in range(outer):
        for i in range(inner):
            mi, ni = (o, i) if order == "mnk" else (i, o)
            for ki in range(grid_k):
                if (mi, ki) != a_prev:
                    a, a_prev = a + 1, (mi, ki)
                if (ki, ni) != b_prev:
                    b, b_prev = b + 1, (ki, ni)
    return a, b


def check_matmul_plan(t, m, k, n, batch, ta, tb, tout, c):
    """Checks a matmul plan against the rules, independently of how it was chosen."""
    d, budget = c["mxu_size"], c["vmem_bytes"]
    ia, ib, io = item(ta), item(tb), item(tout)
    bm, bk, bn = t["block"]
    assert t["kind"] == "matmul" and t["vmem_budget_bytes"] == budget
    assert bm % max(sub_tile(ia), sub_tile(io)) == 0 and bk % d == 0 and bn % d == 0, t["block"]
    mp, kp, np_ = round_up(m, max(sub_tile(ia), sub_tile(io))), round_up(k, d), round_up(n, d)
    assert bm <= mp and bk <= kp and bn <= np_
    gm, gn, gk = -(-mp // bm), -(-np_ // bn), -(-kp // bk)
    assert t["grid"] == [batch, gm, gn, gk]
    vmem = (
        2 * block_bytes(bm, bk, ia) + 2 * block_bytes(bk, bn, ib) + 2 * block_bytes(bm, bn, io) + block_bytes(bm, bn, 4)
    )
    assert t["vmem_bytes"] == vmem <= budget
    whole = (
        2 * block_bytes(mp, kp, ia)
        + 2 * block_bytes(kp, np_, ib)
        + 2 * block_bytes(mp, np_, io)
        + block_bytes(mp, np_, 4)
    )
    a_bytes = batch * round_up(m, sub_tile(ia)) * round_up(k, 128) * ia
    b_bytes = batch * round_up(k, sub_tile(ib)) * round_up(n, 128) * ib
    if gm * gn * gk <= 20000:
        fa, fb = simulated_fetches(gm, gn, gk, t["order"])
        assert t["hbm_reread_bytes"] == _reread(fa, fb, gm, gn, gk, a_bytes, b_bytes), (t, fa, fb)
    if whole <= budget:
        assert t["hbm_reread_bytes"] == 0 and t["grid"] == [batch, 1, 1, 1]
    useful = batch * m * k * n
    assert t["mxu_utilization"] == pytest.approx(useful / (batch * round_up(m, 8) * kp * np_), rel=1e-12)


def _reread(fa, fb, gm, gn, gk, a_bytes, b_bytes):
    # fa block fetches of an lhs split in gm*gk blocks read it fa / (gm*gk) times; the same for the rhs.
    return round(a_bytes * (fa / (gm * gk) - 1) + b_bytes * (fb / (gn * gk) - 1))


DTYPES = [
    (torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16, torch.float32),
    (torch.float16, torch.float16, torch.float16),
    (torch.int8, torch.int8, torch.int32),
]


# ---- plans on random shapes, every chip ----


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(TPU_TARGETS),
    m=st.integers(1, 20000),
    k=st.integers(1, 20000),
    n=st.integers(1, 20000),
    batch=st.integers(1, 4),
    dtypes=st.sampled_from(DTYPES),
)
def test_matmul_plans_fit_vmem_and_are_mxu_aligned(name, m, k, n, batch, dtypes):
    tte = _tte()
    tte.set_target(name)
    t = tte._C._plan_matmul(m, k, n, batch, *dtypes)
    check_matmul_plan(t, m, k, n, batch, *dtypes, chip(name))


def _shapes():
    dims = st.lists(st.integers(1, 3000), min_size=1, max_size=4)
    return dims.filter(lambda s: math.prod(s) <= 1 << 26)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(TPU_TARGETS),
    ops=st.lists(
        st.tuples(
            _shapes(),
            st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.int64, torch.float16]),
            st.sampled_from(["input", "output", "temporary"]),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_vector_plans_fit_vmem_and_are_tile_aligned(name, ops):
    tte = _tte()
    tte.set_target(name)
    c = chip(name)
    t = tte._C._plan_vector([(list(s), dt, role) for s, dt, role in ops])
    assert t["kind"] == "vector" and t["mxu_utilization"] is None and t["hbm_reread_bytes"] == 0
    br, bc = t["block"]
    sub = max(sub_tile(item(dt)) for _, dt, _ in ops)
    assert br % sub == 0 and bc % 128 == 0, t["block"]
    # The grid spans the largest operand as 2-D (a 1-D one folded into rows of 128).
    big = max(ops, key=lambda o: math.prod(o[0]))[0]
    numel = math.prod(big)
    rows, cols = (-(-numel // 128), min(numel, 128)) if len(big) == 1 else (numel // big[-1], big[-1])
    assert t["grid"] == [-(-rows // br), -(-cols // bc)]
    assert len(t["blocks"]) == len(ops)
    total = 0
    for b, (s, dt, role) in zip(t["blocks"], ops):
        full = math.prod(s) == numel
        shape = [rows, cols] if full else ([1, s[0]] if len(s) == 1 else [math.prod(s[:-1]), s[-1]])
        assert b["shape"] == shape and b["block"] == [min(br, shape[0]), min(bc, shape[1])]
        assert b["buffers"] == (1 if role == "temporary" else 2)
        assert b["vmem_bytes"] == b["buffers"] * block_bytes(*b["block"], item(dt))
        total += b["vmem_bytes"]
    assert t["vmem_bytes"] == total <= c["vmem_bytes"]
    # The largest block: doubling the rows (when the grid has more) would not fit.
    if t["grid"][0] > 1:
        bigger = sum(
            b["buffers"] * block_bytes(min(2 * br, b["shape"][0]), min(bc, b["shape"][1]), item(dt))
            for b, (_, dt, _) in zip(t["blocks"], ops)
        )
        assert bigger > c["vmem_bytes"] or 2 * br >= round_up(rows, sub)


# ---- plans of real programs ----


def test_matmul_that_fits_vmem_has_no_rereads():
    tte = _tte()
    tte.set_target("tpu-v5e")
    torch.set_float32_matmul_precision("highest")
    c = chip("tpu-v5e")
    ac, bc = torch.randn(512, 384), torch.randn(384, 256)
    a, b = ac.to("tpu"), bc.to("tpu")
    prof, out = profiled(lambda: a @ b)
    k = only_kernel(prof, "mm")
    t = k["tiling"]
    check_matmul_plan(t, 512, 384, 256, 1, torch.float32, torch.float32, torch.float32, c)
    assert t["grid"] == [1, 1, 1, 1] and t["hbm_reread_bytes"] == 0
    hbm = k["bytes_read"] + k["bytes_written"] + k["padding_bytes"]
    assert k["memory_s"] == pytest.approx(hbm / c["hbm_bandwidth"], rel=1e-12)
    torch.testing.assert_close(out.cpu(), ac @ bc)


def test_huge_matmul_on_v4_rereads_and_its_memory_time_grows():
    tte = _tte()
    torch.set_float32_matmul_precision("highest")
    n = 2048  # f32: 16 MiB per operand, as much as v4's whole VMEM
    ac, bc = torch.randn(n, n), torch.randn(n, n)
    a, b = ac.to("tpu"), bc.to("tpu")
    runs = {}
    for name in ("tpu-v4", "tpu-v5e"):
        tte.set_target(name)
        prof, out = profiled(lambda: a @ b)
        runs[name] = only_kernel(prof, "mm")
        check_matmul_plan(runs[name]["tiling"], n, n, n, 1, torch.float32, torch.float32, torch.float32, chip(name))
        torch.testing.assert_close(out.cpu(), ac @ bc, rtol=1e-4, atol=1e-3)
    v4, v5e = runs["tpu-v4"], runs["tpu-v5e"]
    logical = 3 * n * n * 4
    assert v4["bytes_read"] + v4["bytes_written"] == logical == v5e["bytes_read"] + v5e["bytes_written"]
    assert v5e["tiling"]["hbm_reread_bytes"] == 0
    reread = v4["tiling"]["hbm_reread_bytes"]
    assert reread >= n * n * 4  # at least one operand is read twice
    assert v4["memory_s"] == pytest.approx((logical + reread) / chip("tpu-v4")["hbm_bandwidth"], rel=1e-12)
    assert v5e["memory_s"] == pytest.approx(logical / chip("tpu-v5e")["hbm_bandwidth"], rel=1e-12)


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e"])
def test_mxu_utilization_is_useful_over_padded_macs(name):
    tte = _tte()
    tte.set_target(name)
    d = chip(name)["mxu_size"]
    m, kk, nn, batch = 100, 130, 60, 3
    ac, bc = torch.randn(batch, m, kk).bfloat16(), torch.randn(batch, kk, nn).bfloat16()
    a, b = ac.to("tpu"), bc.to("tpu")
    prof, out = profiled(lambda: torch.bmm(a, b))
    t = only_kernel(prof, "bmm")["tiling"]
    assert t["mxu_utilization"] == pytest.approx(m * kk * nn / (round_up(m, 8) * round_up(kk, d) * round_up(nn, d)))
    assert t["grid"][0] == batch
    torch.testing.assert_close(out.cpu().float(), torch.bmm(ac.float(), bc.float()), rtol=2e-2, atol=0.5)


def test_large_vector_region_on_v4_is_blocked_and_fits():
    tte = _tte()
    tte.set_target("tpu-v4")
    c = chip("tpu-v4")
    xc, bc = torch.randn(2048, 4096), torch.randn(4096)  # x alone is 32 MiB
    x, b = xc.to("tpu"), bc.to("tpu")
    prof, out = profiled(lambda: (x * 2 + b).relu().sum(0))
    t = only_kernel(prof, "sum")["tiling"]
    assert t["kind"] == "vector" and t["vmem_bytes"] <= c["vmem_bytes"]
    br, bcol = t["block"]
    assert br % 8 == 0 and bcol % 128 == 0
    assert t["grid"][0] * br >= 2048 and t["grid"][1] * bcol >= 4096 and t["grid"][0] * t["grid"][1] > 1
    torch.testing.assert_close(out.cpu(), (xc * 2 + bc).relu().sum(0), rtol=1e-4, atol=1e-3)


def test_bf16_vector_blocks_are_16_row_multiples():
    tte = _tte()
    tte.set_target("tpu-v4")
    xc = torch.randn(3000, 1000).bfloat16()
    x = xc.to("tpu")
    prof, out = profiled(lambda: x * 3 + 1)
    t = prof.kernels[0]["tiling"]
    assert t["block"][0] % 16 == 0 and t["block"][1] % 128 == 0
    assert all(b["dtype"] == "BFloat16" for b in t["blocks"])
    assert torch.equal(out.cpu(), xc * 3 + 1)


def test_every_kernel_of_a_training_step_has_a_plan_that_fits():
    tte = _tte()
    torch.manual_seed(0)
    model_c = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    xc, yc = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for name in TPU_TARGETS:
        tte.set_target(name)
        model = __import__("copy").deepcopy(model_c).to("tpu")
        x, y = xc.to("tpu"), yc.to("tpu")

        def step():
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss

        prof, loss = profiled(step)
        assert prof.kernels
        for k in prof.kernels:
            t = k["tiling"]
            assert t is not None and t["vmem_bytes"] <= t["vmem_budget_bytes"] == chip(name)["vmem_bytes"], k["name"]
        ref = torch.nn.functional.cross_entropy(model_c(xc), yc)
        torch.testing.assert_close(loss.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_profiler_table_shows_the_tiling():
    tte = _tte()
    tte.set_target("tpu-v4")
    a, b = torch.randn(2048, 2048).to("tpu"), torch.randn(2048, 2048).to("tpu")
    prof, _ = profiled(lambda: a @ b)
    t = only_kernel(prof, "mm")["tiling"]
    text = prof.table(file=None)
    head, row = text.splitlines()[0], text.splitlines()[2]
    assert "grid" in head and "VMEM MiB" in head and "MXU %" in head
    assert "x".join(map(str, t["grid"])) in row and f"{t['vmem_bytes'] / 2**20:.2f}" in row
    assert prof.summary()[0]["tiling"] == t


# ---- convolutions: MXU work on the implicit GEMM ----


def conv_out(size, k, stride, pad, dil):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e"])
@pytest.mark.parametrize("groups,stride,pad,dil", [(1, 1, 1, 1), (2, 2, 0, 1), (4, 1, 2, 2)])
def test_conv2d_is_costed_on_its_implicit_gemm(name, groups, stride, pad, dil):
    tte = _tte()
    tte.set_target(name)
    torch.set_float32_matmul_precision("highest")
    c = chip(name)
    d = c["mxu_size"]
    nb, cin, cout, h, w, kh, kw = 2, 8, 12, 17, 19, 3, 2
    xc, wc = torch.randn(nb, cin, h, w), torch.randn(cout, cin // groups, kh, kw)
    x, wt = xc.to("tpu"), wc.to("tpu")
    prof, out = profiled(
        lambda: torch.nn.functional.conv2d(x, wt, stride=stride, padding=pad, dilation=dil, groups=groups)
    )
    k = only_kernel(prof, "convolution")
    ho, wo = conv_out(h, kh, stride, pad, dil), conv_out(w, kw, stride, pad, dil)
    gm, gk, gn = nb * ho * wo, cin // groups * kh * kw, cout
    assert k["flops"] == 2 * gm * gk * gn
    passes = 6  # f32 at "highest": bf16x6
    assert k["mxu_flops"] == 2 * round_up(gm, 8) * round_up(gk, d) * round_up(gn, d) * passes
    assert k["compute_s"] == pytest.approx(k["mxu_flops"] / c["peak_bf16_flops"], rel=1e-12)
    t = k["tiling"]
    assert t["kind"] == "matmul" and t["vmem_bytes"] <= c["vmem_bytes"]
    assert t["mxu_utilization"] == pytest.approx(gm * gk * gn / (round_up(gm, 8) * round_up(gk, d) * round_up(gn, d)))
    ref = torch.nn.functional.conv2d(xc, wc, stride=stride, padding=pad, dilation=dil, groups=groups)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_bf16_conv1d_is_one_mxu_pass():
    tte = _tte()
    tte.set_target("tpu-v5e")
    d = chip("tpu-v5e")["mxu_size"]
    xc, wc = torch.randn(4, 16, 50).bfloat16(), torch.randn(32, 16, 5).bfloat16()
    x, wt = xc.to("tpu"), wc.to("tpu")
    prof, out = profiled(lambda: torch.nn.functional.conv1d(x, wt))
    k = only_kernel(prof, "convolution")
    gm, gk, gn = 4 * 46, 16 * 5, 32
    assert k["mxu_flops"] == 2 * round_up(gm, 8) * round_up(gk, d) * round_up(gn, d)
    torch.testing.assert_close(
        out.cpu().float(), torch.nn.functional.conv1d(xc.float(), wc.float()), rtol=2e-2, atol=0.3
    )


def test_conv_backward_costs_both_gradients_on_the_mxu():
    tte = _tte()
    tte.set_target("tpu-v5e")
    torch.set_float32_matmul_precision("highest")
    d = chip("tpu-v5e")["mxu_size"]
    nb, cin, cout, h, w, kk = 2, 6, 10, 12, 12, 3
    xc = torch.randn(nb, cin, h, w, requires_grad=True)
    wc = torch.randn(cout, cin, kk, kk, requires_grad=True)
    bc = torch.randn(cout, requires_grad=True)
    x = xc.detach().to("tpu").requires_grad_()
    wt = wc.detach().to("tpu").requires_grad_()
    b = bc.detach().to("tpu").requires_grad_()
    out = torch.nn.functional.conv2d(x, wt, b, padding=1)
    torch.tpu.synchronize()
    prof, _ = profiled(lambda: out.sum().backward())
    k = only_kernel(prof, "convolution_backward")
    pos = nb * h * w  # padding 1 keeps 12x12
    macs = pos * cout * cin * kk * kk  # the forward's MACs; each gradient has as many
    assert k["flops"] == 2 * 2 * macs + nb * cout * h * w  # + grad_bias, one op per grad_output element
    dx = (pos, cout, cin * kk * kk)  # grad_input in col2im form: (M, K, N)
    dw = (cout, pos, cin * kk * kk)  # grad_weight
    padded = sum(round_up(m, 8) * round_up(k_, d) * round_up(n_, d) for m, k_, n_ in (dx, dw))
    assert k["mxu_flops"] == 2 * padded * 6
    ref = torch.nn.functional.conv2d(xc, wc, bc, padding=1)
    ref.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(b.grad.cpu(), bc.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose2d_forward_and_backward_are_costed_on_the_mxu(groups):
    tte = _tte()
    tte.set_target("tpu-v6e")
    torch.set_float32_matmul_precision("highest")
    d = chip("tpu-v6e")["mxu_size"]
    nb, cin, cout, h, w, kk, stride = 2, 8, 6, 7, 9, 3, 2
    xc = torch.randn(nb, cin, h, w, requires_grad=True)
    wc = torch.randn(cin, cout // groups, kk, kk, requires_grad=True)
    x = xc.detach().to("tpu").requires_grad_()
    wt = wc.detach().to("tpu").requires_grad_()
    fwd = lambda a, b: torch.nn.functional.conv_transpose2d(a, b, stride=stride, groups=groups)  # noqa: E731
    prof, out = profiled(lambda: fwd(x, wt))
    k = only_kernel(prof, "convolution")
    # Every input position scatters Cin/groups x Cout/groups x kh x kw products per group.
    macs = nb * h * w * cin * (cout // groups) * kk * kk
    assert k["flops"] == 2 * macs
    gm, gk, gn = nb * h * w, cin // groups, cout * kk * kk  # the transposed product: (M, K, N)
    assert gm * gk * gn == macs
    assert k["mxu_flops"] == 2 * round_up(gm, 8) * round_up(gk, d) * round_up(gn, d) * 6
    ref = fwd(xc, wc)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    torch.tpu.synchronize()
    prof, _ = profiled(lambda: out.sum().backward())
    k = only_kernel(prof, "convolution_backward")
    assert k["flops"] == 2 * 2 * macs  # grad_input and grad_weight, no bias
    ref.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-3)


# ---- torch.profiler ----


def test_torch_profiler_lists_tpu_region_ranges(tmp_path):
    tte = _tte()
    tte.set_target("tpu-v5e")
    xc, wc = torch.randn(64, 128), torch.randn(128, 32)
    x, w = xc.to("tpu"), wc.to("tpu")
    torch.tpu.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as tp:
        with tte.profile() as prof:
            out = ((x * 2 + 1).relu() @ w).cpu()
    names = {e.key for e in tp.key_averages()}
    assert prof.kernels
    for k in prof.kernels:
        assert "tpu::" + k["name"] in names, (k["name"], sorted(n for n in names if n.startswith("tpu")))
    path = tmp_path / "trace.json"
    tp.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name", "").startswith("tpu::")]
    by_name = {e["name"]: e for e in events}
    for k in prof.kernels:
        assert by_name["tpu::" + k["name"]]["args"]["ops"] == ",".join(k["ops"])
    torch.testing.assert_close(out, (xc * 2 + 1).relu() @ wc)
