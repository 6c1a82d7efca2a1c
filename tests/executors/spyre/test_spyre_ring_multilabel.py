"""multilabel_margin_loss on the Spyre ring (issue 21, branch spyre21s): with
reduction 'mean' or 'sum' each row's loss (CPU's kernel with reduction
'none' on the row's values and its target row, split with the input) is
summed over the ring, 'mean' divided by the rows; the is_target result is
rows of the split rows each tile writes. With 'none' the loss is one value
per row and walks the tile steps.

The reference is independent of the executor: CPU's float32 kernel with
reduction 'none' on the whole input, the losses summed in the order
docs/ktir.md defines (each corelet's rows of each core's tile, corelet 0 then
1, tiles in order, cores in order: test_spyre_ring's _ordered_total), divided
by the row count for 'mean'. Results equal it bit for bit and are close to
CPU's op (whose kernel sums every row in double). float32 only: CPU's kernel
has no 16-bit form.
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu
from test_spyre_numerics import same
from test_spyre_ring import _close, _ordered_total
from test_spyre_ring_extrema import _special

pytestmark = requires_tpu

SHAPES = [(64, 30), (1000, 30), (37, 200), (3000, 16)]
SHAPE_IDS = ["64x30", "1000x30", "37x200", "3000x16"]


def _operands(shape, special):
    x = (
        _special(torch.float32, shape, 70)
        if special
        else torch.randn(shape, generator=torch.Generator().manual_seed(71))
    )
    # Targets: class indices, a row's list ending at its first -1 (some rows none).
    t = torch.randint(-1, shape[-1], shape, generator=torch.Generator().manual_seed(72))
    if len(shape) == 2:
        t[::9] = -1  # rows without a target
    return x, t


def _schedule():
    from torch_tpu_eager import spyre

    (s,) = spyre.last_schedule()
    assert s["executed"] == "tiles", s["whole_reason"]
    return s


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("special", [False, True], ids=["randn", "nan_inf_zeros"])
def test_multilabel_margin_loss_on_the_ring(spyre_target, shape, special):
    from torch_tpu_eager import metrics, metrics_report, reset_metrics

    x, t = _operands(shape, special)
    d, td = x.to("tpu"), t.to("tpu")
    per_row = F.multilabel_margin_loss(x, t, reduction="none")
    for reduction in ("mean", "sum", "none"):
        reset_metrics()
        got = F.multilabel_margin_loss(d, td, reduction=reduction).cpu()
        s = _schedule()
        if reduction == "none":
            want = per_row
        else:
            v = per_row.unsqueeze(1)
            want = _ordered_total(v, s, lambda lo, hi: v[lo:hi].sum(), lambda a, b: a + b)
            if reduction == "mean":
                want = want / float(shape[0])
            assert s["ring_steps_run"] == s["cores_used"] - 1
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert same(got, want) == 0, reduction
        if not special:
            _close(got, F.multilabel_margin_loss(x, t, reduction=reduction), torch.float32)
        assert metrics()["library_calls"] == 0, reduction
        assert "spyre_library_call." not in metrics_report(), reduction


@pytest.mark.parametrize("reduction", [0, 1, 2], ids=["none", "mean", "sum"])
def test_multilabel_is_target_rows(spyre_target, reduction):
    # The forward op's second result: 1.0 where a class is one of the row's targets.
    x, t = _operands((1000, 30), False)
    out, is_target = torch.ops.aten.multilabel_margin_loss_forward(x.to("tpu"), t.to("tpu"), reduction)
    want_out, want_is_target = torch.ops.aten.multilabel_margin_loss_forward(x, t, reduction)
    assert torch.equal(is_target.cpu(), want_is_target)
    _close(out.cpu(), want_out, torch.float32)
    _schedule()


def test_multilabel_of_one_sample_runs_whole(spyre_target):
    # A 1-D input is one sample: its classes are not rows to split.
    from torch_tpu_eager import spyre

    x, t = _operands((300,), False)
    got = F.multilabel_margin_loss(x.to("tpu"), t.to("tpu")).cpu()
    assert same(got, F.multilabel_margin_loss(x, t)) == 0
    assert spyre.last_schedule()[-1]["executed"] == "whole"
