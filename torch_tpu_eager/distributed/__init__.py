"""torch.distributed for the "tpu" device: the c10d backend ``"tpu_ccl"``.

``import torch_tpu_eager`` registers the backend with
``torch.distributed.Backend.register_backend`` as the default for the "tpu"
device, so ``torch.distributed.init_process_group()`` (no backend argument),
``init_process_group("tpu_ccl")`` and ``init_process_group("cpu:gloo,tpu:tpu_ccl")``
all give collectives on "tpu" tensors. See docs/distributed.md and
:mod:`torch_tpu_eager.distributed.backend`.

Public: :data:`BACKEND_NAME`, :func:`collective_metrics`, :func:`reset_collective_metrics`,
:func:`ici_stream` (the stream a chip's collectives run on).
"""

from .backend import BACKEND_NAME, collective_metrics, ici_stream, register, reset_collective_metrics  # noqa: F401

__all__ = ["BACKEND_NAME", "collective_metrics", "ici_stream", "reset_collective_metrics"]
