"""ATen calls a recorded op makes beyond CPU's own: each removed one stays removed.

A warm nanoGPT step (benchmarks/run_all.py) calls no more ATen ops on "tpu" than on CPU
(torch.profiler, one step each, docs/performance.md section `disp22`) except where the
device's record itself dispatched ops: the bounds check of a host-held index (aminmax and
two ``item()`` calls an embedding lookup) and scaled_dot_product_attention through the
overrideable entry points (one more op and two ``empty`` calls forward, one more op
backward). Each test counts the nested ATen calls of one such call against CPU's and checks
the call's values, gradients and errors against CPU.
"""

import collections

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu

pytestmark = requires_tpu

DEV = "tpu"


def nested_calls(fn):
    """{(parent op, child op): count} of the ATen calls made inside other ATen calls by ``fn()``."""
    with torch.profiler.profile() as prof:
        fn()
    counts = collections.Counter()
    for e in prof.events():
        parent = e.cpu_parent
        if parent is not None and parent.name.startswith("aten::") and e.name.startswith("aten::"):
            counts[(parent.name, e.name)] += 1
    return counts


def children_of(counts, parent):
    return {child: n for (p, child), n in counts.items() if p == parent}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_embedding_lookup_with_host_indices_dispatches_as_cpu(dtype):
    weight = torch.randn(10, 4)
    idx = torch.tensor([[0, 9, 3], [3, 3, 1]], dtype=dtype)
    weight_t, idx_t = weight.to(DEV).requires_grad_(), idx.to(DEV)  # idx_t's values stay on the host
    weight.requires_grad_()
    F.embedding(idx_t, weight_t)  # the first call infers the output (meta ops); later calls reuse it
    torch.tpu.synchronize()  # idx_t has no queued reader: its values are checked at the call
    calls_t = children_of(nested_calls(lambda: F.embedding(idx_t, weight_t)), "aten::index_select")
    calls = children_of(nested_calls(lambda: F.embedding(idx, weight)), "aten::index_select")
    # CPU's index_select checks the indices inside its kernel: no aminmax, no item().
    assert "aten::aminmax" not in calls and "aten::item" not in calls
    assert "aten::aminmax" not in calls_t and "aten::item" not in calls_t
    out, out_t = F.embedding(idx, weight), F.embedding(idx_t, weight_t)
    out.sum().backward()
    out_t.sum().backward()
    torch.testing.assert_close(out_t.cpu(), out)
    torch.testing.assert_close(weight_t.grad.cpu(), weight.grad)


# Host-held indices read through strides (a non-contiguous view), at the edges of the
# range and one past them, with int32 and int64: the call raises CPU's error or computes
# CPU's values.
STRIDED_INDEX = {
    "in_range_every_other": (torch.tensor([0, 99, 5, -99, 2, 99]), slice(0, None, 2)),
    "too_big_every_other": (torch.tensor([0, 6, 5, 1, 2, 7]), slice(1, None, 2)),
    "negative_every_other": (torch.tensor([-1, 0, 5, 1]), slice(0, None, 2)),
    "last_valid": (torch.tensor([5, 0]), slice(None)),
    "empty": (torch.tensor([], dtype=torch.int64), slice(None)),
}


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001  (compared with CPU's: type and message)
        return (type(exc), str(exc))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("case", sorted(STRIDED_INDEX))
def test_index_select_strided_host_index_checked_as_cpu(case, dtype):
    base, view = STRIDED_INDEX[case]
    x = torch.arange(12.0).reshape(6, 2)
    idx = base.to(dtype)
    idx_t = idx.to(DEV)
    cpu = _outcome(lambda: x.index_select(0, idx[view]))
    dev = _outcome(lambda: x.to(DEV).index_select(0, idx_t[view]).cpu())
    assert dev[0] == cpu[0]
    if cpu[0] == "ok":
        torch.testing.assert_close(dev[1], cpu[1])
    else:
        assert dev[1] == cpu[1]


@pytest.mark.parametrize("case", ["in_range", "negative_in_range", "too_big", "too_small"])
def test_advanced_indexing_host_index_checked_without_aminmax(case):
    vals = {"in_range": [0, 5, 2], "negative_in_range": [-6, -1], "too_big": [1, 6], "too_small": [0, -7]}[case]
    x = torch.arange(6.0)
    idx = torch.tensor(vals)
    x_t, idx_t = x.to(DEV), idx.to(DEV)
    assert "aten::aminmax" not in {c for (_, c) in nested_calls(lambda: _outcome(lambda: x_t[idx_t]))}
    cpu = _outcome(lambda: x[idx])
    dev = _outcome(lambda: x_t[idx_t].cpu())
    assert dev[0] == cpu[0]
    if cpu[0] == "ok":
        torch.testing.assert_close(dev[1], cpu[1])
    else:
        assert dev[1] == cpu[1]


def test_sdpa_dispatches_cpus_ops_and_autograd_node():
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    q_t = q.detach().to(DEV).requires_grad_()

    def run(x):
        out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        out.sum().backward()
        return out

    run(q_t)
    torch.tpu.synchronize()
    calls_t = nested_calls(lambda: run(q_t))
    calls = nested_calls(lambda: run(q))
    # ATen's SDPA calls CPU's fused kernel directly, as on CPU: not the overrideable op,
    # whose kernel dispatched that same op again and made two philox tensors.
    sdpa = "aten::scaled_dot_product_attention"
    assert (
        children_of(calls_t, sdpa)
        == children_of(calls, sdpa)
        == {"aten::_scaled_dot_product_flash_attention_for_cpu": 1}
    )
    assert not any("overrideable" in name for pair in calls_t for name in pair)
    q.grad, q_t.grad = None, None
    out, out_t = run(q), run(q_t)
    assert out_t.grad_fn.name() == out.grad_fn.name()
    torch.testing.assert_close(out_t.cpu(), out)
    torch.testing.assert_close(q_t.grad.cpu(), q.grad)
