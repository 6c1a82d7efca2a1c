"""The simulated IBM Spyre target (issue 6): executor selection, df16 storage
numerics of 16-bit floats, int64 held as int32, the cost model.

16-bit programs are checked against an emulation written here: the same
program on CPU in float32 with every op's result (and every host->device copy)
passed once through the codec's ``spyre.df16_round``, op by op.
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from difftest import REPO_ROOT, requires_tpu

pytestmark = requires_tpu

EXAMPLES = os.path.join(REPO_ROOT, "examples")


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _program_f32(x, y, w):
    a = torch.relu(x * y + 0.5)
    b = torch.softmax(a, dim=-1)
    c = b @ w
    c.add_(x[:, :1])
    return c.sum(dim=0), torch.tanh(c).amax(dim=1)


def test_spyre_is_a_target_and_switches_back(spyre_target):
    tte = spyre_target
    assert tte.get_target() == "spyre"
    assert "spyre" in tte.list_targets()
    info = tte.target_info("spyre")
    assert info["kind"] == "spyre" and info["cores"] == 32


def test_float32_program_matches_cpu_on_spyre_as_on_tpu(spyre_target):
    tte = spyre_target
    g = torch.Generator().manual_seed(0)
    x, y, w = (torch.randn(8, 40, generator=g), torch.randn(8, 40, generator=g), torch.randn(40, 24, generator=g))
    want = _program_f32(x, y, w)
    got_spyre = [t.cpu() for t in _program_f32(x.to("tpu"), y.to("tpu"), w.to("tpu"))]
    tte.set_target("tpu-v5e")
    # The matmul's epilogue (add_ of x[:, :1], a strided read, then tanh) is a
    # fused loop: its tanh follows set_fused_math, whose "cpu" routines are
    # CPU's own (bit-equal; the default "sleef" is within 1 ulp).
    prev_math = tte.fused_math()
    tte.set_fused_math("cpu")
    try:
        with _highest():
            got_tpu = [t.cpu() for t in _program_f32(x.to("tpu"), y.to("tpu"), w.to("tpu"))]
    finally:
        tte.set_fused_math(prev_math)
    for s, t, c in zip(got_spyre, got_tpu, want):
        assert torch.equal(t, c)
    # Row-local results equal CPU's bit for bit; c.sum(dim=0) reduces the split
    # rows over the ring of cores, whose f32 order (each core's rows, then the
    # partials chained in core order) is the device's, not CPU's: equal up to
    # f32 summation order (tests/executors/spyre/test_spyre_numerics.py checks
    # the order bit for bit).
    assert torch.equal(got_spyre[1], want[1])
    torch.testing.assert_close(got_spyre[0], want[0], rtol=1e-6, atol=1e-5)


class _highest:
    """float32 matmuls at full precision (the TPU target emulates bf16 passes otherwise)."""

    def __enter__(self):
        self.prev = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc):
        torch.set_float32_matmul_precision(self.prev)


def _program_16(x, y, z, r):
    """A 16-bit program; r(t) is applied to every op's result (identity on device)."""
    a = r(x + y)
    b = r(a * z)
    c = r(torch.exp(b))
    d = r(c.sum(dim=-1))
    e = r(torch.softmax(b, dim=-1))
    b.mul_(3.0)
    b = r(b)  # an in-place result: the device rounds it in place
    f = r(b - e)
    return d, e, f


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_program_matches_f32_rounded_once_through_df16_at_each_op(spyre_target, dtype):
    # Each op computes in f32 from its inputs' values and rounds once to df16
    # (stored in dtype); the emulation runs the program in f32 and rounds each
    # op's result (tests/executors/spyre/test_spyre_numerics.py has an independent codec).
    from torch_tpu_eager import spyre

    g = torch.Generator().manual_seed(1)
    x, y, z = (torch.randn(16, 33, generator=g).to(dtype) for _ in range(3))
    r = lambda t: spyre.df16_round(t.float()).to(dtype).float()  # noqa: E731
    want = _program_16(r(x), r(y), r(z), r)
    got = [t.cpu() for t in _program_16(x.to("tpu"), y.to("tpu"), z.to("tpu"), lambda t: t)]
    plain = _program_16(x, y, z, lambda t: t)
    for gt, wt in zip(got, want):
        assert gt.dtype == dtype
        assert torch.equal(gt, wt.to(dtype)), (gt.float() - wt).abs().max()
    # The emulation is not the plain CPU program: the test sees df16 rounding.
    assert any(not torch.equal(p, w.to(dtype)) for p, w in zip(plain, want))


def test_host_to_device_copy_rounds_16bit_floats(spyre_target):
    from torch_tpu_eager import spyre

    x = torch.tensor([1 + 2.0**-10, 65504.0, 0.1, -3.0], dtype=torch.float16)
    got = x.to("tpu").cpu()
    assert torch.equal(got, spyre.df16_round(x))  # 65504 rounds to df16 65536: inf in float16
    assert not torch.equal(got[:1], x[:1])  # 1 + 2**-10 needs 10 fraction bits: df16 has 9
    # bfloat16 reaches below df16's smallest magnitude 2**-31 * (1 + 2**-9): flushed to zero.
    b = torch.tensor([1e-12, -1e-12, 3.0, 2.0**-31 * 1.5], dtype=torch.bfloat16)
    assert torch.equal(b.to("tpu").cpu(), torch.tensor([0.0, -0.0, 3.0, 2.0**-31 * 1.5], dtype=torch.bfloat16))
    assert torch.equal(b.to("tpu").cpu().signbit(), b.signbit())
    y = torch.tensor([1 + 2.0**-10], dtype=torch.float32)
    assert torch.equal(y.to("tpu").cpu(), y)  # float32 is stored as is


def test_int64_result_outside_int32_raises_overflow_error_naming_the_op(spyre_target):
    a = torch.tensor([2**30, 5], dtype=torch.int64).to("tpu")
    b = a * 4
    with pytest.raises(OverflowError, match="mul"):
        b.cpu()
    ok = (a + 1).cpu()
    assert torch.equal(ok, torch.tensor([2**30 + 1, 6]))


def test_int64_inplace_result_outside_int32_raises(spyre_target):
    a = torch.tensor([2**31 - 1, 0], dtype=torch.int64).to("tpu")
    a.add_(1)
    with pytest.raises(OverflowError, match="add_"):
        a.cpu()


def test_int64_copy_to_device_outside_int32_raises(spyre_target):
    with pytest.raises(OverflowError, match="int32"):
        torch.tensor([2**40]).to("tpu")


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "queued"])
@pytest.mark.parametrize(
    "source,dtype",
    [
        (torch.tensor([2**40 + 5, 7]), torch.int32),  # CPU wraps: no int32 check of a value never held as int64
        (torch.tensor([2**40 + 5, 7]), torch.float32),
        (torch.tensor([60000.0, 1.0009765625], dtype=torch.float16), torch.int64),  # no df16 rounding of the source
        (torch.tensor([60000.0, 1.0009765625], dtype=torch.float16), torch.float32),
    ],
    ids=["int64-to-int32", "int64-to-float32", "float16-to-int64", "float16-to-float32"],
)
def test_host_copy_converts_as_cpu_whether_or_not_the_destination_is_queued(spyre_target, source, dtype, queued):
    # Spyre's storage rules (int64 as int32, 16-bit floats as df16) apply to the
    # destination's dtype, not to the source's: a copy converts as CPU's copy_ does.
    expected = torch.zeros(2, dtype=dtype).copy_(source)
    dst = torch.zeros(2, dtype=dtype, device="tpu")
    if queued:
        dst.mul_(1)  # still queued when the copy arrives: it is staged and recorded
    else:
        torch.tpu.synchronize()  # nothing queued: the copy writes the device buffer now
    dst.copy_(source)
    assert torch.equal(dst.cpu(), expected)


def test_int64_is_unchecked_on_the_tpu_target():
    tte = _tte()
    assert tte.get_target().startswith("tpu")
    a = torch.tensor([2**30], dtype=torch.int64).to("tpu")
    assert torch.equal((a * 4).cpu(), torch.tensor([2**32]))


# ---------------------------------------------------------------- cost model


def _card():
    info = _tte().target_info("spyre")
    return {
        "cores": info["cores"],
        "mac_rate": info["matmul_sustained_mac_per_ns_per_core"] * 1e9,
        "vec_rate": info["vector_elems_per_us_per_core"] * 1e6,
        "bw": info["dram_bandwidth_mixed"],
        "overlap": info["overlap_factor"],
        "stick": info["stick_bytes"],
    }


def test_data_file_holds_the_issues_calibrated_constants():
    c = _card()
    assert (c["cores"], c["mac_rate"], c["vec_rate"], c["bw"], c["overlap"], c["stick"]) == (
        32,
        1140e9,
        1760e6,
        105e9,
        0.46,
        128,
    )


def _profile_one(fn):
    tte = _tte()
    with tte.profile() as prof:
        fn()
    return prof.kernels


def test_large_matmul_runs_at_the_sustained_mac_rate(spyre_target):
    c = _card()
    m, k, n = 512, 1024, 768  # multiples of the 32-element float32 stick: no padding
    a, b = torch.randn(m, k).to("tpu"), torch.randn(k, n).to("tpu")
    ks = _profile_one(lambda: (a @ b).cpu())
    (kern,) = [x for x in ks if "mm" in x["name"]]
    macs = m * k * n
    assert kern["flops"] == 2 * macs
    rate_per_core = macs / kern["compute_s"] / c["cores"]
    assert rate_per_core == pytest.approx(1140e9, rel=1e-9)
    assert kern["bytes_read"] == (m * k + k * n) * 4 and kern["bytes_written"] == m * n * 4
    assert kern["padding_bytes"] == 0
    cc, mm = kern["compute_s"], kern["memory_s"]
    assert mm == pytest.approx((m * k + k * n + m * n) * 4 / c["bw"], rel=1e-12)
    assert kern["sim_time_s"] == pytest.approx(cc + mm - c["overlap"] * min(cc, mm), rel=1e-12)


def test_streaming_elementwise_region_runs_at_the_memory_rate(spyre_target):
    c = _card()
    x, y = torch.randn(512, 1024).to("tpu"), torch.randn(512, 1024).to("tpu")
    ks = _profile_one(lambda: (x + y).cpu())
    (kern,) = ks
    moved = kern["bytes_read"] + kern["bytes_written"] + kern["padding_bytes"]
    assert moved == 3 * 512 * 1024 * 4
    assert moved / kern["memory_s"] == pytest.approx(c["bw"], rel=1e-12)
    assert kern["compute_s"] == pytest.approx(512 * 1024 / (c["vec_rate"] * c["cores"]), rel=1e-12)
    assert kern["compute_s"] < kern["memory_s"]  # memory bound
    cc, mm = kern["compute_s"], kern["memory_s"]
    assert kern["sim_time_s"] == pytest.approx(mm + (1 - c["overlap"]) * cc, rel=1e-12)
    # Overlap hides 46% of the compute: the region streams at >= 90% of the DRAM rate.
    assert 0.9 * c["bw"] <= moved / kern["sim_time_s"] <= c["bw"]


def test_sizes_are_padded_to_whole_sticks(spyre_target):
    # float16 is held as df16: 64 per 128-byte stick; 10 columns occupy one stick.
    x = torch.ones(3, 10, dtype=torch.float16).to("tpu")
    ks = _profile_one(lambda: torch.neg(x).cpu())
    (kern,) = ks
    assert kern["bytes_read"] == 3 * 10 * 2 and kern["bytes_written"] == 3 * 10 * 2
    assert kern["padding_bytes"] == 2 * (3 * 128 - 3 * 10 * 2)
    assert kern["target"] == "spyre"


# ---------------------------------------------------------------- programs


def test_train_digits_quick_runs_on_spyre(spyre_target):
    pytest.importorskip("sklearn", reason="the digits data ships with scikit-learn (examples extra)")
    spec = importlib.util.spec_from_file_location("train_digits", os.path.join(EXAMPLES, "train_digits.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick"]) == 0


def test_env_var_selects_spyre_at_import():
    code = "import torch_tpu_eager as t; print(t.get_target())"
    env = dict(os.environ, TORCH_TPU_TARGET="spyre")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "spyre"


# ---------------------------------------------------------------- KTIR tile programs
# Golden texts written by hand from the format in docs/ktir.md.


def test_ktir_of_an_add(spyre_target):
    from torch_tpu_eager import spyre

    x, y = torch.randn(4, 64).to("tpu"), torch.randn(4, 64).to("tpu")
    z = x + y
    text = spyre.dump_ktir()
    assert text == (
        "ktir.kernel @kernel_add grid=[32] split=dim0 rows_per_core=1 cores_used=4 {\n"
        "  %a0 = arg in f32 elems=256\n"
        "  %a1 = arg in f32 elems=256\n"
        "  %a2 = arg out f32 elems=256\n"
        "  %0 = view HBM f32 %a0 offset=0 sizes=[4, 64] strides=[64, 1]\n"
        "  %1 = view HBM f32 %a1 offset=0 sizes=[4, 64] strides=[64, 1]\n"
        "  %2 = view HBM f32 %a2 offset=0 sizes=[4, 64] strides=[64, 1]\n"
        "  tile %0 sizes=[1, 64] at=[core*1, 0]\n"
        "  tile %1 sizes=[1, 64] at=[core*1, 0]\n"
        "  tile %2 sizes=[1, 64] at=[core*1, 0]\n"
        "  %2 = add.Tensor(%0, %1, 1)\n"
        "}\n"
    )
    assert torch.equal(z.cpu(), x.cpu() + y.cpu())


def test_ktir_of_a_softmax(spyre_target):
    from torch_tpu_eager import spyre

    x = torch.randn(70, 128).to(torch.float16).to("tpu")
    y = torch.softmax(x, dim=-1)
    # 70 rows over 32 cores: 3 rows per core on 24 cores.
    assert spyre.dump_ktir() == (
        "ktir.kernel @kernel__softmax grid=[32] split=dim0 rows_per_core=3 cores_used=24 {\n"
        "  %a0 = arg in df16(f16) elems=8960\n"
        "  %a1 = arg out df16(f16) elems=8960\n"
        "  %0 = view HBM df16(f16) %a0 offset=0 sizes=[70, 128] strides=[128, 1]\n"
        "  %1 = view HBM df16(f16) %a1 offset=0 sizes=[70, 128] strides=[128, 1]\n"
        "  tile %0 sizes=[3, 128] at=[core*3, 0]\n"
        "  tile %1 sizes=[3, 128] at=[core*3, 0]\n"
        "  %1 = _softmax(%0, -1, False)\n"
        "}\n"
    )
    del y


def test_ktir_of_a_matmul_with_offset_and_transposed_views(spyre_target):
    from torch_tpu_eager import spyre

    a, b = torch.randn(66, 32).to("tpu"), torch.randn(16, 32).to("tpu")
    c = a[1:65] @ b.t()
    # The right operand's dim 0 (32) is not the grid's rows (64): every core reads it whole.
    assert spyre.dump_ktir() == (
        "ktir.kernel @kernel_mm grid=[32] split=dim0 rows_per_core=2 cores_used=32 {\n"
        "  %a0 = arg in f32 elems=2112\n"
        "  %a1 = arg in f32 elems=512\n"
        "  %a2 = arg out f32 elems=1024\n"
        "  %0 = view HBM f32 %a0 offset=32 sizes=[64, 32] strides=[32, 1]\n"
        "  %1 = view HBM f32 %a1 offset=0 sizes=[32, 16] strides=[1, 32]\n"
        "  %2 = view HBM f32 %a2 offset=0 sizes=[64, 16] strides=[16, 1]\n"
        "  tile %0 sizes=[2, 32] at=[core*2, 0]\n"
        "  tile %1 sizes=[32, 16] at=[0, 0]\n"
        "  tile %2 sizes=[2, 16] at=[core*2, 0]\n"
        "  %2 = mm(%0, %1)\n"
        "}\n"
    )
    del c


def test_ktir_temporaries_live_in_lx_and_dump_dir_gets_each_region(spyre_target, tmp_path, monkeypatch):
    from torch_tpu_eager import spyre

    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    x = torch.randn(8, 64).to("tpu")
    z = torch.exp(x * 2) + 1
    text = spyre.dump_ktir()
    assert "ktir.kernel @fused_" in text and " = view LX f32 " in text
    files = sorted(tmp_path.iterdir())
    assert files and "\n".join(f.read_text() for f in files) == text
    del z


def test_ktir_unknown_dump_option_raises_value_error():
    from torch_tpu_eager import spyre

    with pytest.raises(ValueError, match="format"):
        spyre.dump_ktir(format="json")


def test_ktir_prints_python_numbers_as_literals(spyre_target):
    from torch_tpu_eager import spyre

    x = torch.randn(4, 64).to("tpu")
    y = x * 2
    assert "  %1 = mul.Tensor(%0, 2)\n" in spyre.dump_ktir()
    del y
