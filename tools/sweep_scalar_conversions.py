"""Sweep CPU: which Scalar arguments of which ATen ops CPU converts with an overflow check, per result dtype.

Runs every OpInfo sample of op_db on CPU in each swept dtype under a dispatch
mode; for every ATen call that has a Scalar argument (passed, or left to its
default), calls the op again with that argument set to values that overflow the result dtype but not float
(1e6 and 70000 for float16, 3.4e38 for bfloat16), that overflow float (1e39),
complex<float> and complex<Half> (real or imaginary part), int8 and int32, and
non-finite values (inf, -inf, nan), and records whether CPU raises
"value cannot be converted to type T without overflow" and for which T.

Prints one line per (overload, argument, dtype): the values that raise and the
type named in the message ("result" when it is the result dtype's type). Feeds
the tables of csrc/ops/scalar_checks.cpp; tests/record/test_scalar_overflow.py and
tests/record/test_scalar_overflow_float.py check each row (and non-row) against CPU.

Usage: python tools/sweep_scalar_conversions.py [--dtypes float16,bfloat16,float32] [--out FILE.json]
(about 1 minute per dtype on 2 cores)
"""

import argparse
import json
import math
import re
import sys
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_tpu_eager  # noqa: F401  (op_db's device tables must see "tpu")

# Per dtype: the replacement values tried.
VALUES = {
    torch.float16: [1e6, 70000, 1e39, math.inf, -math.inf, math.nan],
    torch.bfloat16: [3.4e38, 1e39, math.inf, -math.inf, math.nan],
    torch.float32: [1e39, math.inf, math.nan],
    torch.float64: [1e39, math.inf, math.nan],
    torch.complex64: [1e39, complex(0, 1e39), math.inf],
    torch.complex32: [1e6, complex(0, 1e6), math.inf],
    torch.int8: [300, 300.0, -300, math.inf],
    torch.int32: [2**40, 2.0**40],
}
_OVERFLOW = re.compile(r"value cannot be converted to type (\S+) without overflow")


def _scalar_positions(schema):
    """(index, name, kwarg_only) of the arguments typed Scalar or Scalar?."""
    return [
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(schema.arguments)
        if str(a.type) in ("number", "Optional[number]")
    ]


class _Probe(TorchDispatchMode):
    def __init__(self, dtype, found):
        super().__init__()
        self.dtype = dtype
        self.found = found  # (overload, arg, result dtype) -> {value repr: outcomes}
        self.depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for i, name, kwarg_only in _scalar_positions(func._schema):
            if name in kwargs:
                orig = kwargs[name]
            elif not kwarg_only and i < len(args):
                orig = args[i]
            else:
                orig = "default"  # not passed: passed below by name
            if orig is None:
                continue
            for v in VALUES[self.dtype]:
                a, k = list(args), dict(kwargs)
                # Clone written tensors: an in-place op must not change the sample.
                a = [x.clone() if isinstance(x, torch.Tensor) else x for x in a]
                k = {kk: (x.clone() if isinstance(x, torch.Tensor) else x) for kk, x in k.items()}
                if name in k or orig == "default":
                    k[name] = v
                else:
                    a[i] = v
                try:
                    func(*a, **k)
                    outcome = "ok"
                except Exception as e:  # noqa: BLE001  (every outcome is recorded)
                    m = _OVERFLOW.search(str(e))
                    outcome = f"raises:{m.group(1)}" if m else f"other:{type(e).__name__}"
                res = out[0] if isinstance(out, (tuple, list)) and out else out
                rdt = str(res.dtype).replace("torch.", "") if isinstance(res, torch.Tensor) else "-"
                key = (str(func), name, rdt)
                self.found[key].setdefault(repr(v), set()).add(outcome)
        return out


def sweep(dtypes, ops=None):
    """{sample dtype: {"overload arg result-dtype": {value: sorted outcomes}}} over op_db's samples on CPU.

    ``ops``: OpInfo names to sweep (all of op_db when None).
    """
    from torch_tpu_eager.testing import load_op_db

    result = {}
    for dtype in dtypes:
        found = defaultdict(dict)
        for op in load_op_db():
            if ops is not None and op.name not in ops:
                continue
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
            except Exception:  # noqa: BLE001  (a sample generator that fails is skipped)
                continue
            for s in samples[:40]:
                if s.input is not None and isinstance(s.input, torch.Tensor) and s.input.numel() > 10000:
                    continue
                try:
                    with _Probe(dtype, found):
                        op.op(s.input, *s.args, **s.kwargs)
                except Exception:  # noqa: BLE001  (a sample CPU rejects says nothing here)
                    pass
        result[str(dtype).replace("torch.", "")] = {
            f"{o} {a} {r}": {v: sorted(out) for v, out in vals.items()} for (o, a, r), vals in sorted(found.items())
        }
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="float16,bfloat16,float32,float64,complex64,complex32,int8,int32")
    p.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    p.add_argument("--out")
    ns = p.parse_args(argv)
    dtypes = [getattr(torch, d) for d in ns.dtypes.split(",")]
    res = sweep(dtypes, ns.ops.split(",") if ns.ops else None)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
    for dt, rows in res.items():
        for key, vals in rows.items():
            raising = {v: o for v, o in vals.items() if any(x.startswith("raises") for x in o)}
            if raising:
                print(dt, key, " ".join(f"{v}->{'|'.join(o)}" for v, o in raising.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
