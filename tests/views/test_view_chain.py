"""View decomposition and inversion (csrc/views/) against CPU's strided views."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from difftest import requires_tpu

pytestmark = requires_tpu


def _C():
    import torch_tpu_eager

    return torch_tpu_eager._C


@st.composite
def views_of_storage(draw):
    """A random valid view (sizes, strides, offset) of a flat storage."""
    ndim = draw(st.integers(0, 4))
    sizes = [draw(st.integers(0, 5)) for _ in range(ndim)]
    strides = [draw(st.integers(0, 30)) for _ in range(ndim)]
    offset = draw(st.integers(0, 10))
    span = offset + sum((s - 1) * t for s, t in zip(sizes, strides) if s > 0) + 1
    numel = span + draw(st.integers(0, 8))
    return numel, sizes, strides, offset


@settings(max_examples=300, deadline=None, database=None)
@given(views_of_storage())
def test_apply_reads_what_as_strided_reads(v):
    numel, sizes, strides, offset = v
    flat = torch.arange(float(numel))
    expected = flat.as_strided(sizes, strides, offset)
    got = _C()._view_apply(flat, sizes, strides, offset)
    assert got.shape == expected.shape and torch.equal(got, expected)


@settings(max_examples=300, deadline=None, database=None)
@given(views_of_storage())
def test_scatter_writes_what_as_strided_writes(v):
    numel, sizes, strides, offset = v
    expected = torch.arange(float(numel))
    view = expected.as_strided(sizes, strides, offset)
    if any(s > 1 and t == 0 for s, t in zip(sizes, strides)) or torch._debug_has_internal_overlap(view) == 1:
        return  # writes through overlapping views are undefined
    value = -torch.arange(1.0, view.numel() + 1).reshape(view.shape)
    view.copy_(value)
    got = torch.arange(float(numel))
    _C()._view_scatter(got, sizes, strides, offset, value)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "make, chain",
    [
        (lambda x: x.view(4, 6)[:, 1:3], "narrow(0, 24) -> reshape[4, 6] -> slice(1, 1, 2)"),
        (lambda x: x.view(4, 6).t(), "narrow(0, 24) -> reshape[4, 6] -> permute[1, 0]"),
        (lambda x: x[::2], "narrow(0, 24) -> reshape[12, 2] -> select(1, 0)"),
        (
            lambda x: x.view(4, 6)[1:, 0].unsqueeze(1).expand(3, 5),
            "narrow(6, 18) -> reshape[3, 6] -> select(1, 0) -> unsqueeze(1) -> expand[3, 5]",
        ),
    ],
)
def test_common_views_need_no_gather(make, chain):
    x = torch.arange(24.0)
    v = make(x)
    text, gather, padded = _C()._view_chain(24, list(v.shape), list(v.stride()), v.storage_offset())
    assert not gather and not padded and text == chain


def test_overlapping_windows_gather():
    v = torch.arange(10.0).unfold(0, 4, 2)  # windows overlap: no slice/reshape chain exists
    text, gather, _ = _C()._view_chain(10, list(v.shape), list(v.stride()), v.storage_offset())
    assert gather and text == "gather"
