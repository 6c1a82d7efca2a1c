"""Let torchvision 0.28.0's pure-Python models import on CPU torch.

Its only wheel is a CUDA build whose C ops (_C.so) do not load here; its Python
side registers fake kernels for torchvision::nms and torchvision::qnms at import,
which fails unless their schemas exist. Define the two schemas (no kernels)
before torchvision (or transformers, which imports it) is imported.
"""

import torch

_lib = None


def install():
    global _lib
    if _lib is not None:
        return
    try:
        torch.ops.torchvision.nms.default
        return
    except (AttributeError, RuntimeError):
        pass
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


install()
