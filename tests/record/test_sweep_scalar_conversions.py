"""tools/sweep_scalar_conversions.py still finds what CPU does (the source of ops/scalar_checks.cpp's table)."""

import importlib.util
import os

import torch

from difftest import REPO_ROOT

_TOOL = os.path.join(REPO_ROOT, "tools", "sweep_scalar_conversions.py")


def _load_tool():
    spec = importlib.util.spec_from_file_location("sweep_scalar_conversions", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sweep_tells_the_result_dtype_from_opmath():
    res = _load_tool().sweep([torch.float16], ops=["nn.functional.hardtanh", "addcmul"])["float16"]
    # CPU itself, independent of the sweep: hardtanh converts its bounds to Half, addcmul its value to float.
    for fn, kind in (
        (lambda: torch.nn.functional.hardtanh(torch.zeros(2, dtype=torch.half), -1, 1e6), "c10::Half"),
        (lambda: torch.addcmul(*[torch.zeros(2, dtype=torch.half)] * 3, value=1e39), "float"),
    ):
        try:
            fn()
            raise AssertionError("CPU accepted the value")
        except RuntimeError as e:
            assert f"type {kind} without overflow" in str(e)
    assert res["aten.hardtanh.default max_val float16"]["1000000.0"] == ["raises:c10::Half"]
    assert res["aten.hardtanh.default max_val float16"]["inf"] == ["ok"]  # inf converts to Half
    assert res["aten.addcmul.default value float16"]["1000000.0"] == ["ok"]
    assert res["aten.addcmul.default value float16"]["1e+39"] == ["raises:float"]
