"""A host (CPU) bool/uint8 mask indexing a "tpu" tensor: the result's shape is the mask's
values' (its number of True elements), so the meta cache keys the mask by value
(record.cpp key_host_mask_values). Keyed by shape only, the second call with another
mask of the same shape took the first call's shape (PyTorch's test_ops.py
test_noncontiguous_samples_index_put: "The size of tensor a (3) must match the size of
tensor b (0)" at the read)."""

import warnings

import pytest
import torch
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)

MASKS = ([1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0])


def _on(dev, fn):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uint8 masks are deprecated (the same warning on both)
        try:
            return fn(dev)
        except Exception as e:  # noqa: BLE001  (compared by type and message)
            return (type(e), str(e).splitlines()[0])


def _same(fn):
    cpu, tpu = _on("cpu", fn), _on("tpu", fn)
    if isinstance(cpu, tuple) and isinstance(cpu[0], type):
        assert tpu == cpu
        return
    assert len(tpu) == len(cpu)
    for t, c in zip(tpu, cpu):
        assert t.shape == c.shape
        torch.testing.assert_close(t.cpu(), c)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
@pytest.mark.parametrize(
    "index",
    [lambda x, m: x[m], lambda x, m: x[m, 1:], lambda x, m: x[:, m], lambda x, m: torch.ops.aten.index(x, [m])],
    ids=["x[m]", "x[m,1:]", "x[:,m]", "aten.index"],
)
def test_masks_of_one_shape_in_turn(dtype, index):
    def run(dev):
        x = torch.arange(25.0, device=dev).reshape(5, 5)
        return [index(x, torch.tensor(m, dtype=dtype)) for m in MASKS]

    _same(run)


def test_zero_dim_mask():
    def run(dev):
        x = torch.arange(6.0, device=dev).reshape(2, 3)
        return [x[torch.tensor(b)] for b in (True, False, True)]

    _same(run)


def test_mask_beyond_the_keyed_size():
    # More elements than the key holds by value: the call is not cached at all.
    def run(dev):
        x = torch.arange(4096.0, device=dev).reshape(2048, 2)
        g = torch.Generator().manual_seed(1)
        masks = [torch.rand(2048, generator=g) < p for p in (0.3, 0.7, 0.0)]
        return [x[m] for m in masks]

    _same(run)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_values_checked_against_this_mask(accumulate):
    # index_put_'s meta kernel checks the values against the indexed shape; with the
    # first mask's shape the second call took a broadcast CPU rejects (and wrote wrong rows).
    def run(dev):
        out = []
        for m, v in (([1, 1, 0, 1, 0], torch.ones(3, 4)), ([0, 1, 0, 0, 0], torch.ones(3, 4))):
            x = torch.zeros(5, 4, device=dev)
            out.append(x.index_put_((torch.tensor(m, dtype=torch.bool),), v.to(dev), accumulate=accumulate))
        return out

    _same(run)


def test_index_put_backward_with_masks_in_turn():
    # The OpInfo samples of index_put: gradients of input and values for masks of one shape.
    def run(dev):
        grads = []
        for m in ([1, 1, 0, 1, 0], [0, 0, 0, 0, 0]):
            x = torch.randn(5, 5).to(dev).requires_grad_()
            v = torch.randn(5).to(dev).requires_grad_()
            out = torch.index_put(x, (torch.tensor(m, dtype=torch.bool),), v, accumulate=True)
            grads += torch.autograd.grad(out, [x, v], torch.randn(5, 5).to(dev))
        return grads

    _same(run)
