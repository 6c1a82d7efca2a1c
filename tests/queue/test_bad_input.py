"""Bad input: errors of the same type as CPU, raised at the right time, with the queue
left usable afterwards."""

import re

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu, run_both_outcome

SAME_DEVICE_MSG = "Expected all tensors to be on the same device"


# ---------------------------------------------------------------------------
# mixing devices
# ---------------------------------------------------------------------------

MIXED = {
    "add": lambda t, c: t + c,
    "radd": lambda t, c: c + t,
    "mul_out_of_place": lambda t, c: torch.mul(t, c),
    "inplace_add": lambda t, c: t.add_(c),
    "inplace_into_cpu": lambda t, c: c.add_(t),
    "mm": lambda t, c: torch.mm(t.view(2, 2), c.view(2, 2)),
    "matmul": lambda t, c: t.view(2, 2) @ c.view(2, 2),
    "cat": lambda t, c: torch.cat([t, c]),
    "stack": lambda t, c: torch.stack([c, t]),
    "where": lambda t, c: torch.where(t > 0, t, c),
    "maximum": lambda t, c: torch.maximum(t, c),
    "eq": lambda t, c: t == c,
}


@requires_tpu
@pytest.mark.parametrize("op", sorted(MIXED))
def test_mixing_device_and_cpu_tensor_raises(dev, op):
    t = torch.arange(4.0).to(dev)
    c = torch.arange(4.0)  # not 0-dim: only 0-dim CPU tensors may mix with device tensors
    with pytest.raises(RuntimeError, match=SAME_DEVICE_MSG):
        r = MIXED[op](t, c)
        r.cpu()
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and c.tolist() == [0.0, 1.0, 2.0, 3.0]


@requires_tpu
def test_mixing_one_element_cpu_tensor_that_is_not_0dim_raises(dev):
    t = torch.arange(4.0).to(dev)
    with pytest.raises(RuntimeError, match=SAME_DEVICE_MSG):
        (t + torch.ones(1)).cpu()


def test_zero_dim_cpu_tensor_is_allowed(dev):
    t = torch.arange(4.0).to(dev)
    r = t * torch.tensor(2.0) + torch.tensor(1)
    assert r.device.type == torch.device(dev).type and r.cpu().tolist() == [1.0, 3.0, 5.0, 7.0]


# Written arguments (out=, in-place self) must be on the device even when 0-dim: CUDA's
# TensorIterator admits a CPU scalar only as an input. Each case gets (tpu tensor, cpu tensor)
# and writes into the CPU one, or reads a CPU tensor CUDA rejects.
CPU_WRITTEN_OR_REJECTED = {
    "nonzero_out_0dim": lambda t, c0, c: torch.nonzero(t, out=c0.long()),
    "nonzero_out": lambda t, c0, c: torch.nonzero(t, out=c.long()),
    "add_out_0dim": lambda t, c0, c: torch.add(t, t, out=c0),
    "add_out": lambda t, c0, c: torch.add(t, t, out=c),
    "sum_out_0dim": lambda t, c0, c: torch.sum(t, 0, out=c0),
    "sort_out": lambda t, c0, c: torch.sort(t, out=(c, c.long())),
    "max_dim_out_0dim": lambda t, c0, c: torch.max(t, 0, out=(c0, c0.long())),
    "cumsum_out": lambda t, c0, c: torch.cumsum(t, 0, out=c),
    "mm_out": lambda t, c0, c: torch.mm(t.view(2, 2), t.view(2, 2), out=c.view(2, 2)),
    "cat_out": lambda t, c0, c: torch.cat([t, t], out=c),
    "cpu_0dim_inplace_self": lambda t, c0, c: c0.add_(t[0]),
    "cpu_inplace_self": lambda t, c0, c: c.mul_(t),
    "inplace_cpu_other": lambda t, c0, c: t.add_(c),
    "copy_into_index_of_cpu": lambda t, c0, c: c.index_copy_(0, torch.tensor([0], device=t.device), t[:1]),
    "index_select_cpu_index": lambda t, c0, c: t.index_select(0, c.long()),
    "index_add_cpu_source": lambda t, c0, c: t.index_add_(0, torch.tensor([0, 1, 2, 3], device=t.device), c),
    "index_put_cpu_values": lambda t, c0, c: t.index_put_((torch.tensor([0, 1, 2, 3], device=t.device),), c),
    "masked_scatter_cpu_source": lambda t, c0, c: t.masked_scatter_(t > 1, c),
    "where_cpu_other": lambda t, c0, c: torch.where(t > 1, t, c),
}


@requires_tpu
@pytest.mark.parametrize("case", sorted(CPU_WRITTEN_OR_REJECTED))
def test_cpu_tensor_written_or_mixed_raises_at_call(dev, case):
    """Every out= / in-place / tensor argument is checked before anything is written."""
    t = torch.arange(4.0).to(dev)
    pending = t * 2  # a pending op: the failed call must leave the queue valid
    c0 = torch.tensor(7.0)
    c = torch.arange(4.0) + 10
    with pytest.raises(RuntimeError, match=SAME_DEVICE_MSG):
        CPU_WRITTEN_OR_REJECTED[case](t, c0, c)
    assert c0.item() == 7.0 and c.tolist() == [10.0, 11.0, 12.0, 13.0]
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and pending.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert (t + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


CPU_ALLOWED = {  # CUDA admits these: a read-only CPU scalar, CPU index lists
    "mul_cpu_scalar": lambda t: t * torch.tensor(3.0),
    "inplace_cpu_scalar_other": lambda t: t.clone().add_(torch.tensor(2.0)),
    "where_cpu_scalar": lambda t: torch.where(t > 1, t, torch.tensor(0.0)),
    "index_cpu_indices": lambda t: t[torch.tensor([0, 2])],
    "index_put_cpu_indices_scalar_value": lambda t: t.clone().index_put_((torch.tensor([1]),), torch.tensor(5.0)),
    "masked_fill_cpu_scalar": lambda t: t.clone().masked_fill_(t > 1, torch.tensor(-1.0)),
}


@pytest.mark.parametrize("case", sorted(CPU_ALLOWED))
def test_cpu_scalars_and_indices_allowed_like_cuda(dev, case):
    cpu = CPU_ALLOWED[case](torch.arange(4.0))
    got = CPU_ALLOWED[case](torch.arange(4.0).to(dev))
    assert got.device.type == torch.device(dev).type and torch.equal(got.cpu(), cpu)


@requires_tpu
def test_nonzero_out_checks_like_cuda(dev):
    """PyTorch's test_nonzero: a 0-dim out of the wrong dtype / device raises; a device one is resized."""
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.uint8):
        x = torch.tensor([[0, 1], [1, 0]]).to(dtype).to(dev)
        with pytest.raises(RuntimeError, match="scalar type Long"):
            torch.nonzero(x, out=torch.empty([], dtype=torch.float, device=dev))
        with pytest.raises(RuntimeError, match="on the same device"):
            torch.nonzero(x, out=torch.empty([], dtype=torch.long))
        out = torch.empty([], dtype=torch.long, device=dev)
        torch.nonzero(x, out=out)
        assert out.cpu().tolist() == [[0, 1], [1, 0]]


@requires_tpu
def test_cpu_fallback_checks_devices(dev, monkeypatch):
    """An op run through the CPU fallback (no device kernel) checks devices the same way."""
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    v = torch.ones(2, 3).to(dev)
    with pytest.raises(RuntimeError, match=SAME_DEVICE_MSG):
        torch._weight_norm_interface(v, torch.ones(2, 1), 0)
    assert v.cpu().tolist() == [[1.0] * 3] * 2


# ---------------------------------------------------------------------------
# shape errors: raised like CPU; pending tensors stay valid
# ---------------------------------------------------------------------------

SHAPE_ERRORS = {
    "add_broadcast": lambda x: x + torch.ones(5, device=x.device),
    "inplace_broadcast_grows_self": lambda x: x[0].add_(torch.ones(2, 4, device=x.device)),
    "mm_inner_dim": lambda x: torch.mm(x, x),
    "view_bad_numel": lambda x: x.view(5),
    "view_non_viewable": lambda x: x.t().view(-1),
    "reshape_bad": lambda x: x.reshape(7, -1),
    "expand_bad": lambda x: x.expand(3, 5),
    "t_of_3d": lambda x: x.unsqueeze(0).t(),
    "cat_mismatch": lambda x: torch.cat([x, torch.ones(2, 5, device=x.device)], dim=0),
    "select_out_of_range": lambda x: x[5],
    "dim_out_of_range": lambda x: x.sum(3),
    "copy_bad_broadcast": lambda x: x.copy_(torch.ones(4, device=x.device)),
    "masked_fill_bad_mask": lambda x: x.masked_fill_(torch.ones(2, dtype=torch.bool, device=x.device), 0),
    "index_wrong_dtype": lambda x: x[torch.tensor([0.5], device=x.device)],
    "item_of_many": lambda x: x.item(),
    "bool_of_many": lambda x: bool(x),
    "int_pow_negative_scalar": lambda x: x.long() ** -1,
    "mean_of_int": lambda x: x.long().mean(),
}


@pytest.mark.parametrize("case", sorted(SHAPE_ERRORS))
def test_invalid_call_raises_like_cpu_and_queue_survives(dev, case):
    def prog(d):
        return SHAPE_ERRORS[case](torch.arange(6.0, device=d).reshape(2, 3))

    exc = run_both_outcome(prog, dev)
    assert exc is not None, "CPU is expected to reject this call"

    # The error must not poison work recorded before or after it.
    x = torch.arange(6.0, device=dev).reshape(2, 3)
    pending = x * 2 + 1
    view_pending = x.t()
    view_pending.mul_(-1)
    with pytest.raises(type(exc)):
        r = SHAPE_ERRORS[case](x)
        if isinstance(r, torch.Tensor):
            r.cpu()
    assert pending.cpu().tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
    assert x.cpu().tolist() == [[-0.0, -1.0, -2.0], [-3.0, -4.0, -5.0]]
    assert (x + 1).sum().item() == -9.0


# ---------------------------------------------------------------------------
# data-dependent errors: out-of-range indices
# ---------------------------------------------------------------------------

OOB = {
    "index_select": lambda x, d: torch.index_select(x, 0, torch.tensor([0, 5]).to(d)),
    "gather": lambda x, d: torch.gather(x, 0, torch.tensor([[0, 3, 1]]).to(d)),
    "index": lambda x, d: x[torch.tensor([1, 7]).to(d)],
    "index_negative": lambda x, d: x[torch.tensor([-4]).to(d)],
    "take": lambda x, d: torch.take(x, torch.tensor([6]).to(d)),
    "embedding": lambda x, d: F.embedding(torch.tensor([3]).to(d), x),
    "scatter_add_": lambda x, d: x.clone().scatter_add_(0, torch.tensor([[9, 0, 0]]).to(d), torch.ones(1, 3, device=d)),
    "index_put_": lambda x, d: x.clone().index_put_((torch.tensor([4]).to(d),), torch.tensor(1.0).to(d)),
    "index_add_": lambda x, d: x.clone().index_add_(0, torch.tensor([2]).to(d), torch.ones(1, 3, device=d)),
    "index_copy_": lambda x, d: x.clone().index_copy_(0, torch.tensor([3]).to(d), torch.ones(1, 3, device=d)),
}

# Name of the ATen op whose data check fails; the device message must name it.
OOB_OP_NAME = {
    "index_select": "index_select",
    "gather": "gather",
    "index": "index",
    "index_negative": "index",
    "take": "take",
    "embedding": "embedding|index_select",
    "scatter_add_": "scatter_add",
    "index_put_": "index_put",
    "index_add_": "index_add",
    "index_copy_": "index_copy",
}


@pytest.mark.parametrize("case", sorted(OOB))
def test_out_of_range_index_raises_at_read(dev, case):
    exc = run_both_outcome(lambda d: OOB[case](torch.arange(6.0, device=d).reshape(2, 3), d), dev)
    assert isinstance(exc, (IndexError, RuntimeError)), "CPU is expected to reject the index"

    x = torch.arange(6.0, device=dev).reshape(2, 3)
    before = x.exp()  # pending before the bad op
    with pytest.raises(type(exc)) as info:
        bad = OOB[case](x, dev)
        bad.cpu()  # a lazy device reports at the latest here
    if dev == "tpu":
        # Raised at the call (indices already on the host: CPU's own message), or
        # at the read (indices computed on the device: the message names the op).
        assert str(info.value) == str(exc) or re.search(OOB_OP_NAME[case], str(info.value)), (
            f"message is not CPU's and does not name the op: {info.value}"
        )
    after = x.sum(1)  # recorded after the failure
    torch.testing.assert_close(before.cpu(), torch.arange(6.0).reshape(2, 3).exp())
    assert after.cpu().tolist() == [3.0, 12.0]
    assert x.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_good_index_after_bad_index(dev):
    x = torch.arange(10.0).to(dev)
    with pytest.raises(IndexError):
        x[torch.tensor([10]).to(dev)].cpu()
    assert x[torch.tensor([9, 0]).to(dev)].cpu().tolist() == [9.0, 0.0]


# ---------------------------------------------------------------------------
# out= / in-place dtype errors
# ---------------------------------------------------------------------------

DTYPE_ERRORS = {
    "add_float_into_long_out": lambda d: torch.add(
        torch.ones(2, device=d), 0.5, out=torch.empty(2, dtype=torch.long, device=d)
    ),
    "mm_into_long_out": lambda d: torch.mm(
        torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), out=torch.empty(2, 2, dtype=torch.long, device=d)
    ),
    "cat_into_long_out": lambda d: torch.cat([torch.ones(2, device=d)], out=torch.empty(2, dtype=torch.long, device=d)),
    "long_add_float_inplace": lambda d: torch.ones(2, dtype=torch.long, device=d).add_(0.5),
    "bool_sub": lambda d: torch.ones(2, dtype=torch.bool, device=d) - torch.ones(2, dtype=torch.bool, device=d),
    "float_bitwise_and": lambda d: torch.ones(2, device=d) & torch.ones(2, device=d),
    "int_out_for_float_unary": lambda d: torch.sqrt(
        torch.ones(2, device=d), out=torch.empty(2, dtype=torch.int32, device=d)
    ),
}


@pytest.mark.parametrize("case", sorted(DTYPE_ERRORS))
def test_wrong_dtype_raises_like_cpu(dev, case):
    exc = run_both_outcome(DTYPE_ERRORS[case], dev)
    assert exc is not None, "CPU is expected to reject this dtype combination"


def test_leaf_requiring_grad_inplace_raises(dev):
    for d in ("cpu", dev):
        p = torch.ones(3, device=d, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            p.add_(1)
