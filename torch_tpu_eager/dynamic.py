"""Bounded dynamism: sizes that share one compiled region (DESIGN §5)."""

import torch

from . import _C
from ._args import int64_arg


class RecompileWarning(UserWarning):
    """A region kept compiling again: the same ops, dtypes and ranks recorded at one
    Python line compiled for 8 different values of its arguments, or for 8 different
    (power-of-two bucketed) sizes of one dim of its inputs.

    Issued once per line (through :mod:`warnings`, at that line, so
    ``warnings.filterwarnings("ignore", category=RecompileWarning)`` silences it).
    The message says whether :func:`mark_dynamic` helps: only when input tensor
    sizes changed and the ops' arguments (``torch.arange``'s end, a view's shape)
    did not, since argument values are part of a compiled region's key. It is
    issued inside a flush, which cannot raise: an ``"error"`` filter makes it an
    unraisable-exception report (``sys.unraisablehook``) instead of an exception.
    """


_C._set_recompile_warning(RecompileWarning)


def mark_dynamic(t: torch.Tensor, dim: int, lower: int, upper: int) -> None:
    """Declares that dim ``dim`` of ``t`` takes sizes in ``[lower, upper]``.

    Regions that read ``t`` (or a view of its storage with the same rank,
    each mark on the view's dim of the marked stride: dim 1 of ``t.t()`` for
    ``dim=0``) then compile once for every size in the range instead of once
    per power-of-two bucket; so do buffers such a region writes whose size
    follows the marked one (``F.pad``'s ``n + 2``, ``cat(..., out=)``'s
    ``2n``). Call once per dim to mark several dims (any number of them).
    A size outside the range recompiles for its power-of-two bucket, with a
    one-time warning; it never fails.

    Raises ValueError when ``t`` is not a "tpu" tensor, ``dim`` is negative or
    not below ``t.dim()``, or ``lower`` is negative or greater than ``upper``;
    OverflowError when ``lower`` or ``upper`` is past 2**63 - 1.
    """
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        raise ValueError(
            f"mark_dynamic needs a tpu tensor, got {type(t).__name__} on {getattr(t, 'device', 'no device')}"
        )
    if not isinstance(dim, int) or dim < 0 or dim >= t.dim():
        raise ValueError(f"mark_dynamic: dim must be in [0, {t.dim()}) for a {t.dim()}-d tensor, got {dim}")
    if isinstance(lower, int) and isinstance(upper, int):
        int64_arg("mark_dynamic", "lower", lower)
        int64_arg("mark_dynamic", "upper", upper)
    if not (isinstance(lower, int) and isinstance(upper, int)) or lower < 0 or lower > upper:
        raise ValueError(f"mark_dynamic: need 0 <= lower <= upper, got lower={lower}, upper={upper}")
    _C._mark_dynamic(t, dim, lower, upper)
