"""torch_tpu_eager: a deferred-and-fused PrivateUse1 device named "tpu".

``import torch_tpu_eager`` renames PrivateUse1 to ``"tpu"``, registers the
device's ATen kernels (one record kernel per op-table row) and installs the
``torch.tpu`` module. Ops on "tpu" tensors are recorded into a DeferAndFuse
queue and run, fused, on the simulated TPU when a value reaches the host.

Public API: :func:`metrics`, :func:`reset_metrics`, :func:`synchronize`,
:class:`EagerMode`, :func:`set_eager_mode`, :func:`set_queue_limits`,
:func:`op_table`, :func:`set_cache_dir` / :func:`cache_dir` (on-disk cache,
env var ``TORCH_TPU_CACHE_DIR``), :func:`set_target` / :func:`get_target` / :func:`list_targets` /
:func:`target_info` (the simulated chip), :mod:`torch_tpu_eager.ici` (collective costs on the chip
interconnect), :func:`set_fused_math` / :func:`fused_math` (float32 math routines of fused loops),
:class:`profile` (simulated kernel profiler), plus ``torch.tpu`` (see :mod:`torch_tpu_eager.device`).
"""

import torch

from ._cpu_math import initialize_cpu_vector_math as _initialize_cpu_vector_math

_initialize_cpu_vector_math()  # before anything computes: CPU's reference results must not vary by run

from . import _C  # noqa: E402
from ._registration import install as _install  # noqa: E402

_C._env_validate()  # a malformed TORCH_TPU_* variable fails here, naming itself (python -m torch_tpu_eager.env)

_C._set_cache_runtime_tag(torch.__version__)  # part of the on-disk cache's version stamp

_install()

from . import meta_hints as _meta_hints  # noqa: E402

_meta_hints.install()  # Python meta kernels answer for CPU, whose kernels produce the results

from .device import EagerMode, get_eager_mode, set_eager_mode, synchronize  # noqa: E402
from .metrics import debug_summary, metrics, metrics_report, op_table, reset_metrics  # noqa: E402
from .metrics import queue_limits, set_queue_limits  # noqa: E402
from .dynamic import mark_dynamic as mark_dynamic  # noqa: E402  (public API)
from .dynamic import RecompileWarning as RecompileWarning  # noqa: E402  (public API)
from .disk_cache import cache_dir, set_cache_dir  # noqa: E402
from . import spyre  # noqa: E402,F401  (df16 codec: torch_tpu_eager.spyre)
from . import ici  # noqa: E402,F401  (collective costs on the simulated interconnect: torch_tpu_eager.ici)
from .profiler import profile  # noqa: E402
from .target import get_target, list_targets, set_target, target_info  # noqa: E402
from .fused_math import fused_math, set_fused_math  # noqa: E402
from . import target as _target  # noqa: E402

_target._init_from_env()

if _C._debug_level() >= 1:  # TORCH_TPU_DEBUG: the summary at exit
    import atexit as _atexit
    import sys as _sys

    _atexit.register(lambda: print(debug_summary(), file=_sys.stderr))

from . import custom_ops as _custom_ops  # noqa: E402

_custom_ops.install()  # torch.library ops with a "tpu" kernel are recorded (custom_ops.py)

from . import _deterministic  # noqa: E402

_deterministic.install()  # a mode change runs the queued ops first (_deterministic.py)

from . import _default_dtype  # noqa: E402

_default_dtype.install()  # a default dtype change runs the queued ops first (_default_dtype.py)

from . import _lifecycle  # noqa: E402

_lifecycle.install()  # autograd's device thread must not abort interpreter exit

from .distributed import register as _register_distributed  # noqa: E402

_register_distributed()  # the c10d backend "tpu_ccl" (docs/distributed.md)

__all__ = [
    "EagerMode",
    "get_eager_mode",
    "set_eager_mode",
    "synchronize",
    "metrics",
    "metrics_report",
    "debug_summary",
    "reset_metrics",
    "set_queue_limits",
    "queue_limits",
    "op_table",
    "set_cache_dir",
    "cache_dir",
    "profile",
    "set_target",
    "get_target",
    "list_targets",
    "target_info",
    "set_fused_math",
    "fused_math",
]
