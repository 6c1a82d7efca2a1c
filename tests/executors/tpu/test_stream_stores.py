"""Fused loops whose working set passes the last-level cache write their outputs with
non-temporal stores (Program::stream in csrc/executors/tpu/fused_program.h). The stores
change where values go, never what they are: with the threshold lowered to 0 bytes (every
loop streams, except a softmax region of rows over 1,536 floats, whose exp values are
scaled in y), results equal CPU PyTorch bit for bit wherever the ordinary loop does, on
shapes whose rows start off the vector alignment and end in partial vectors, on one and
on two threads."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

# Rows of 1 float, shorter than a vector, 37 (every row start misaligned), whole vectors,
# 1000 (row starts alternate alignment), and one row longer than a grain.
SHAPES = [(5, 1), (9, 7), (33, 37), (64, 64), (257, 1000), (2, 40001)]


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def streaming(request):
    """Every fused loop streams (threshold 0 bytes), on the parametrized thread count."""
    threads, threshold = torch.get_num_threads(), torch_tpu_eager._C._stream_store_threshold()
    torch.set_num_threads(request.param)
    torch_tpu_eager._C._set_stream_store_threshold(0)
    yield
    torch_tpu_eager._C._set_stream_store_threshold(-1)
    torch.set_num_threads(threads)
    assert torch_tpu_eager._C._stream_store_threshold() == threshold, "-1 restores the default"


def _pair(shape, seed):
    return cpu_randn(*shape, seed=seed), cpu_randn(*shape, seed=seed + 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_rows(streaming, shape, fn):
    x, y = _pair(shape, 1)
    assert torch.equal(fn(x.to("tpu"), dim=-1).cpu(), fn(x, dim=-1))
    expected = fn(x * 1.5 - y, dim=-1)
    assert torch.equal(fn(x.to("tpu") * 1.5 - y.to("tpu"), dim=-1).cpu(), expected)


@pytest.mark.parametrize("cols", [7, 64, 1000, 1536])
def test_softmax_rows_with_nan_and_inf_rows(streaming, cols):
    # A NaN or +inf row fills y with the sum's NaN (no streamed store): the other rows still stream.
    x = cpu_randn(6, cols, seed=11)
    x[1, cols // 2] = float("nan")
    x[3, 0] = float("inf")
    x[4] = float("-inf")
    torch.testing.assert_close(
        F.softmax(x.to("tpu"), dim=-1).cpu(), F.softmax(x, dim=-1), rtol=0, atol=0, equal_nan=True
    )


def test_debug_metrics_count_softmax_rows_that_stream():
    # Rows of up to 1,536 floats keep their exp values apart from y and stream y past the
    # threshold (here 0 bytes); wider rows scale the exp values in y and never stream.
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F, torch_tpu_eager as tte
        tte._C._set_stream_store_threshold(0)
        for cols in (1000, 1536, 2048):
            F.softmax(torch.randn(8, cols).to("tpu"), -1).cpu()
        print(tte.metrics_report())
    """)
    env = dict(os.environ, TORCH_TPU_DEBUG="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "  fused_pass.streamed_rows: 2\n" in proc.stdout, proc.stdout


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False], ids=["weight+bias", "neither"])
def test_layer_norm_rows(streaming, shape, affine):
    x, r = _pair(shape, 3)
    w, b = (cpu_randn(shape[-1], seed=5), cpu_randn(shape[-1], seed=6)) if affine else (None, None)
    dev = (lambda t: t.to("tpu")) if affine else (lambda t: None)
    for prologue in (lambda a, c: a, lambda a, c: a + c):  # alone, and fused with a producer
        expected = torch.native_layer_norm(prologue(x, r), shape[-1:], w, b, 1e-5)
        actual = torch.native_layer_norm(
            prologue(x.to("tpu"), r.to("tpu")), shape[-1:], dev(w) if affine else None, dev(b) if affine else None, 1e-5
        )
        for a, e in zip(actual, expected):
            assert torch.equal(a.cpu(), e)


@pytest.mark.parametrize("numel", [1, 15, 1025, 100_003])
def test_elementwise_outputs(streaming, numel):
    x, y = _pair((numel,), 7)

    def prog(a, c):
        h = (a * 1.5 - c) / 3.0  # materialized: read below and returned
        return h, (h.abs() + c).neg()

    for got, want in zip(prog(x.to("tpu"), y.to("tpu")), prog(x, y)):
        assert torch.equal(got.cpu(), want)


def test_misaligned_output_view_of_a_streamed_result(streaming):
    # A result read through a view that starts one float into the buffer.
    x, y = _pair((4097,), 9)
    got = ((x.to("tpu") + y.to("tpu")) * 2.0)[1:].cpu()
    assert torch.equal(got, ((x + y) * 2.0)[1:])


def test_default_threshold_is_three_quarters_of_the_l3_in_sysfs():
    import glob

    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{index}/level") as f_level, open(f"{index}/size") as f_size:
                if f_level.read().strip() == "3":
                    text = f_size.read().strip()
                    sizes.append(int(text[:-1]) * {"K": 1024, "M": 1 << 20}[text[-1]])
        except OSError:
            pass
    expected = sizes[0] // 4 * 3 if sizes else 24 << 20
    assert torch_tpu_eager._C._stream_store_threshold() == expected
