"""Zero-copy reads to the host (device/host_share.h): ``t.cpu()`` of a whole dense
storage hands the CPU tensor the device buffer, copy-on-write on both sides.

Every test compares with the same program run on CPU tensors only: after any
sequence of writes on either side, each tensor holds what it holds on CPU.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from difftest import requires_tpu

pytestmark = requires_tpu

ROWS, COLS = 512, 1024  # 2 MiB of float32: above the 1 MiB sharing threshold


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def _shared_reads():
    return _tte().metrics()["host_reads_shared"]


def test_read_shares_and_matches_cpu():
    x = torch.randn(ROWS, COLS)
    y = torch.softmax(x.to("tpu"), -1)
    before = _shared_reads()
    c = y.cpu()
    assert _shared_reads() == before + 1
    ref = torch.softmax(x, -1)
    assert c.device.type == "cpu" and c.dtype == ref.dtype
    assert c.shape == ref.shape and c.stride() == ref.stride() and c.storage_offset() == 0
    assert c.untyped_storage().nbytes() == ref.untyped_storage().nbytes()
    assert torch.equal(c, ref)


def test_cpu_write_leaves_device_value():
    x = torch.randn(ROWS, COLS)
    y = x.to("tpu") * 2
    c = y.cpu()
    c.add_(1)
    assert torch.equal(c, x * 2 + 1)
    assert torch.equal(y.cpu(), x * 2)


def test_device_write_leaves_cpu_value_and_moves_device_pointer():
    x = torch.randn(ROWS, COLS)
    y = x.to("tpu") * 2
    c = y.cpu()
    ptr = y.data_ptr()
    copies = _tte().metrics()["cow_copies"]
    y.mul_(3)
    assert _tte().metrics()["cow_copies"] == copies + 1
    assert torch.equal(c, x * 2)
    assert torch.equal(y.cpu(), x * 6)
    # The device storage's pointer follows its private copy, so PyTorch's overlap
    # checks see distinct memory for distinct storages.
    assert y.data_ptr() != ptr
    z = torch.empty_like(y)
    torch.add(y, 1, out=z)
    assert torch.equal(z.cpu(), x * 6 + 1)


@pytest.mark.parametrize("write", ["copy_from_host", "out", "index_put", "fill", "zero", "normal"])
def test_every_kind_of_device_write_copies_first(write):
    x = torch.randn(ROWS, COLS)
    y = x.to("tpu").clone()
    c = y.cpu()
    if write == "copy_from_host":
        y.copy_(torch.ones(ROWS, COLS))
    elif write == "out":
        torch.mul(y, 2, out=y)
    elif write == "index_put":  # a data-dependent op, run eagerly through CPU's kernel
        y[y > 0] = 0.0
    elif write == "fill":
        y.fill_(7.0)
    elif write == "zero":
        y.zero_()
    else:
        y.normal_()
    assert torch.equal(c, x)


_ALIASED_OUT = {  # out= whose input is another view of the same storage: run eagerly through CPU's kernel
    "add_data": (lambda x: torch.add(x.data, 1, out=x.data), lambda x: x + 1),
    "sigmoid_detach": (lambda x: torch.sigmoid(x.detach(), out=x), torch.sigmoid),
    "mul_view": (lambda x: torch.mul(x.view(ROWS, COLS), 2, out=x), lambda x: x * 2),
    "where": (
        lambda x: torch.where(x.detach() > 0, x.detach(), torch.tensor(0.0), out=x),
        lambda x: torch.where(x > 0, x, torch.tensor(0.0)),
    ),
    "sort": (
        lambda x: torch.sort(x[:], out=(x, torch.empty(ROWS, COLS, dtype=torch.long, device=x.device))),
        lambda x: torch.sort(x)[0],
    ),
    "cumsum": (lambda x: torch.cumsum(x[:], 1, out=x), lambda x: torch.cumsum(x, 1)),
}


@pytest.mark.parametrize("case", sorted(_ALIASED_OUT))
def test_out_aliasing_its_input_copies_before_the_cpu_kernel_writes(case):
    run, ref = _ALIASED_OUT[case]
    x0 = torch.randn(ROWS, COLS)
    x = x0.to("tpu") * 1
    c = x.cpu()
    run(x)
    assert torch.equal(c, x0)
    assert torch.equal(x.cpu(), ref(x0))


def test_undeclared_writes_of_an_eagerly_run_op_copy_first():
    # native_batch_norm writes running_mean / running_var though its schema does
    # not mark them; an input overlapping running_mean makes it run eagerly.
    n = 262144  # 1 MiB of float32
    rm0, rv0 = torch.randn(n), torch.rand(n) + 1
    rm, rv = rm0.to("tpu") * 1, rv0.to("tpu") * 1
    c = rv.cpu()
    torch.native_batch_norm(rm.view(1, n), None, None, rm, rv, True, 0.5, 1e-5)
    rm_ref, rv_ref = rm0.clone(), rv0.clone()
    torch.native_batch_norm(rm_ref.view(1, n), None, None, rm_ref, rv_ref, True, 0.5, 1e-5)
    assert torch.equal(c, rv0)
    torch.testing.assert_close(rv.cpu(), rv_ref, rtol=0, atol=0, equal_nan=True)


def test_cpu_survives_device_tensor_and_device_memory_is_released():
    x = torch.randn(ROWS, COLS)
    y = x.to("tpu") + 1
    torch.tpu.synchronize()
    allocated = torch.tpu.memory_allocated()
    c = y.cpu()
    del y
    after = torch.tpu.memory_allocated()
    assert after == allocated - ROWS * COLS * 4
    assert torch.equal(c, x + 1)
    c.mul_(2)  # the last holder writes in place
    assert torch.equal(c, (x + 1) * 2)


def test_cpu_resize_then_write():
    x = torch.randn(ROWS, COLS)
    y = x.to("tpu") * 2
    c = y.cpu()
    c.resize_(ROWS + 1, COLS)  # CPU's resize moves the bytes to a new buffer
    c[:ROWS].add_(1)
    assert torch.equal(c[:ROWS], x * 2 + 1)
    assert torch.equal(y.cpu(), x * 2)


def test_two_reads_share_one_buffer_and_stay_independent():
    x = torch.randn(ROWS, COLS)
    y = x.to("tpu") - 1
    a, b = y.cpu(), y.cpu()
    a.neg_()
    assert torch.equal(b, x - 1) and torch.equal(a, -(x - 1))
    y.add_(5)
    assert torch.equal(b, x - 1) and torch.equal(y.cpu(), (x - 1) + 5)


@pytest.mark.parametrize("case", ["small", "offset_view", "transposed", "dtype", "conj"])
def test_reads_that_copy_still_match_cpu(case):
    x = torch.randn(ROWS, COLS)
    d = x.to("tpu")
    before = _shared_reads()
    if case == "small":
        got, ref = (d[:4] * 1).cpu(), x[:4] * 1
    elif case == "offset_view":
        got, ref = d[1:].cpu(), x[1:]
    elif case == "transposed":  # dense, whole storage: shared, with the transposed strides
        got, ref = d.t().cpu(), x.t().cpu()
    elif case == "dtype":
        got, ref = d.to("cpu", torch.float64), x.to(torch.float64)
    else:
        xc = torch.randn(ROWS, COLS // 2, dtype=torch.complex64)
        got, ref = xc.to("tpu").conj().cpu(), xc.conj().cpu()
    assert torch.equal(got.resolve_conj(), ref.resolve_conj())
    assert got.stride() == ref.stride() and got.dtype == ref.dtype
    if case != "conj":  # the Conjugate fallback resolves into a fresh tensor first, which may be shared
        assert _shared_reads() == before + (1 if case == "transposed" else 0)


def test_gradient_flows_through_a_shared_read():
    x = torch.randn(ROWS, COLS)
    xd = x.to("tpu").requires_grad_()
    out = (xd * 3).cpu()
    out.sum().backward()
    assert torch.equal(xd.grad.cpu(), torch.full_like(x, 3.0))


# A random program over one device tensor and the CPU tensors read from it,
# against the same program on CPU tensors only.
_steps = st.lists(
    st.tuples(st.sampled_from(["read", "write_cpu", "write_dev", "drop_cpu", "drop_dev"]), st.integers(0, 3)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(_steps)
def test_random_reads_and_writes_match_cpu(steps):
    x = torch.randn(ROWS, COLS)
    dev, ref_dev = x.to("tpu") + 0, x + 0
    cpus = []  # (tensor read from the device, its reference value)
    for kind, k in steps:
        if kind == "read" and dev is not None:
            cpus.append((dev.cpu(), ref_dev.clone()))
        elif kind == "write_cpu" and cpus:
            t, r = cpus[k % len(cpus)]
            t.add_(k + 1)
            r.add_(k + 1)
        elif kind == "write_dev" and dev is not None:
            dev.mul_(k + 2)
            ref_dev.mul_(k + 2)
        elif kind == "drop_cpu" and cpus:
            cpus.pop(k % len(cpus))
        elif kind == "drop_dev":
            dev = ref_dev = None
    for t, r in cpus:
        assert torch.equal(t, r)
    if dev is not None:
        assert torch.equal(dev.cpu(), ref_dev)
