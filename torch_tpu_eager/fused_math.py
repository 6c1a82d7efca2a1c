"""Which float32 math routines the TPU executor's fused loops use.

CPU PyTorch computes ``torch.exp``, ``log``, ``sin``, ``cos``, ``tanh`` and ``sqrt`` on
float32 with MKL's VML (``at::vml``, in torch's x86-64 wheels), while its own softmax
and sigmoid kernels use ATen's vectorized SLEEF routines. A fused loop uses one or the
other for those six functions:

- ``"sleef"`` (default): vector routines inlined in the loop. Values agree with CPU's
  ``torch.exp`` etc. to a few units in the last place, not bit for bit. log, sin and
  cos are ATen's SLEEF routines (documented bounds: 1.0 ulp for log, 3.5 ulp for sin
  and cos); sqrt is the correctly rounded instruction (CPU's is within 1 ulp of it);
  exp and tanh are the executor's own (a polynomial after range reduction, and tanh
  from that exp), each within 1 ulp of CPU's on every float32 swept
  (docs/tpu_target.md). torch.compile's generated
  code makes the same kind of choice.
- ``"cpu"``: the routines CPU's kernels call, so every fused value equals the CPU op's
  bit for bit, at about twice the cost on a chain of transcendental functions
  (chain16 of ``benchmarks/run_all.py``, one thread: 2.6 vs 7.6 ms on this machine).

Softmax, log_softmax, logsumexp and sigmoid always follow their CPU kernels' routines
(sigmoid's last few elements of each CPU thread's range, which CPU computes with
scalar libm, with that formula too: bit-equal).
The choice is process-wide and applies to flushes after the call; it is not part of
the compile cache key (a cached region picks its routines each time it runs).
"""

from . import _C

MODES = ("sleef", "cpu")


def set_fused_math(mode: str) -> None:
    """Chooses the routines fused loops use for float32 exp, log, sin, cos, tanh, sqrt.

    Args:
        mode: ``"sleef"`` (default; inlined vector routines, within a few ulp of
            CPU) or ``"cpu"`` (the routines of CPU's kernels, bit-equal to CPU).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"fused math mode must be one of {MODES}, got {mode!r}")
    _C._set_fused_math(mode == "cpu")


def fused_math() -> str:
    """The current mode of :func:`set_fused_math`: ``"sleef"`` or ``"cpu"``."""
    return "cpu" if _C._fused_math_is_cpu() else "sleef"
