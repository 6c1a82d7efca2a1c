"""The view ops with a device kernel of their own (view, as_strided, _reshape_alias, unfold,
view_as_real, view_as_complex, view.dtype) run CPU's view kernel on the tpu tensor: the
alias, its metadata, its storage and the errors are CPU's."""

import pytest
import torch

from difftest import run_both


def _meta(t):
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg())


CASES = {
    "view": lambda x: x.view(3, 8),
    "view_dtype": lambda x: x.view(torch.int32),
    "as_strided": lambda x: x.as_strided((3, 3), (4, 1), 2),
    "as_strided_overlapping": lambda x: x.as_strided((5, 4), (2, 1)),
    "reshape_of_transpose_slice": lambda x: x.t()[1:].reshape(-1),
    "unfold": lambda x: x.unfold(0, 4, 2),
    "expand_then_view": lambda x: x[:4].unsqueeze(0).expand(2, 4),
    "conj_view": lambda x: torch.view_as_complex(x.view(12, 2)).conj().view(3, 4),
    "neg_view": lambda x: torch.view_as_complex(x.view(12, 2)).conj().imag.view(2, 6),
    "view_as_real": lambda x: torch.view_as_real(torch.view_as_complex(x.view(12, 2))[2:]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_view_metadata_and_values_match_cpu(name, dev):
    fn = CASES[name]
    base = torch.arange(24, dtype=torch.float32) * 0.5 - 3
    cpu = fn(base)
    out = fn(base.to(dev))
    assert _meta(out) == _meta(cpu)
    assert out.untyped_storage().nbytes() == cpu.untyped_storage().nbytes()
    torch.testing.assert_close(out.resolve_conj().resolve_neg().cpu(), cpu.resolve_conj().resolve_neg(), rtol=0, atol=0)


def test_view_shares_storage_and_version(dev):
    def fn(d):
        x = torch.zeros(4, 6, device=d)
        v = x.as_strided((2, 3), (6, 2), 1)
        before = x._version
        v.add_(1.5)  # written through the view
        return x, v, x._version - before, v._base is x

    run_both(fn, dev)


def test_as_strided_out_of_bounds_raises_cpu_error(dev):
    msgs = []
    for d in ("cpu", dev):
        with pytest.raises(RuntimeError) as e:
            torch.zeros(6, device=d).as_strided((3, 3), (3, 1), 1)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    assert "out of bounds for storage of size 24" in msgs[1]


def test_view_of_incompatible_shape_raises_cpu_error(dev):
    msgs = []
    for d in ("cpu", dev):
        with pytest.raises(RuntimeError) as e:
            torch.zeros(4, 6, device=d).t().view(24)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
