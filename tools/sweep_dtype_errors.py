"""Sweep: does "tpu" raise CPU's dtype errors at the call, as CPU does?

For every OpInfo of op_db (random ops left out) and every dtype it does not support on
CPU (bool, integers, floats, complex; --all-dtypes: every dtype), runs the OpInfo's
first samples in that dtype on CPU and on "tpu" and records for each device whether
the call raised (exception type and message) and, on "tpu", whether an error only came
when the result was read back ("late").

Prints one line per (OpInfo, dtype, sample) whose outcomes differ:

- ``late``: CPU raised at the call, "tpu" did not (it raised at the read, or never);
- ``extra``: "tpu" raised at the call, CPU did not;
- ``message``: both raised at the call, with a different type or message.

It is the source of tests/record/test_dtype_errors_at_the_call.py's cases (the
CPU-kernel probe of csrc/ops/cpu_probe.cpp is what closes the ``late`` rows).

Usage: python tools/sweep_dtype_errors.py [--ops add,gcd] [--dtypes float32,int64]
[--samples 1] [--out FILE.json]   (a few minutes over all of op_db on 2 cores)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import re
import sys
from typing import Optional

import torch

import torch_tpu_eager  # noqa: F401  (registers "tpu" before op_db is built)

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]

# The context the device appends to an error raised at the flush.
_RECORDED_AT = re.compile(r" \(while running .*", re.S)


def _error(e: BaseException) -> tuple:
    """(type name, first line of the message without the device's flush context)."""
    msg = _RECORDED_AT.sub("", str(e)).strip().splitlines()
    return type(e).__name__, msg[0] if msg else ""


def outcome(op, sample, device: str) -> tuple:
    """("ok" | "call" | "read", error or None) of one sample on ``device``."""
    from torch_tpu_eager.testing.opinfo_sweep import _materialize, to_device

    if device == "cpu":
        args = (sample.input, tuple(sample.args), dict(sample.kwargs))
    else:
        args = (
            to_device(sample.input, device),
            to_device(tuple(sample.args), device),
            to_device(dict(sample.kwargs), device),
        )
    try:
        result = op(args[0], *args[1], **args[2])
    except Exception as e:  # noqa: BLE001  (every outcome is recorded)
        return "call", _error(e)
    try:
        _materialize(result)
    except Exception as e:  # noqa: BLE001
        return "read", _error(e)
    return "ok", None


def sweep(
    ops: Optional[list] = None,
    dtypes: Optional[list] = None,
    samples: int = 1,
    all_dtypes: bool = False,
    skip: Optional[list] = None,
    progress: bool = False,
) -> list:
    """Rows {op, dtype, sample, cpu, tpu, kind} where CPU's and "tpu"'s outcomes differ.

    By default only the dtypes an OpInfo does not list as supported on CPU are run
    (where CPU raises); ``all_dtypes`` runs every dtype. ``skip``: OpInfo names left out.
    ``progress``: each OpInfo's name and every row go to stderr as they come.
    """
    from torch_tpu_eager.testing.opinfo_sweep import RANDOM_OPS, UNINITIALIZED_OPS, load_op_db, op_key, sample_inputs

    rows = []
    for op in load_op_db():
        key = op_key(op)
        if ops is not None and key not in ops and op.name not in ops:
            continue
        if key in RANDOM_OPS or key in UNINITIALIZED_OPS or key in (skip or ()):
            continue
        if progress:
            print("op", key, file=sys.stderr, flush=True)
        supported = op.supported_dtypes("cpu")
        for dtype in dtypes or [d for d in DTYPES if all_dtypes or d not in supported]:
            try:
                gen = sample_inputs(op, dtype)
                chosen = []
                for s in gen:
                    chosen.append(s)
                    if len(chosen) >= samples:
                        break
            except Exception:  # noqa: BLE001  (a generator that cannot make this dtype)
                continue
            for i, s in enumerate(chosen):
                try:
                    cpu = outcome(op, s, "cpu")
                    tpu = outcome(op, s, "tpu")
                except Exception:  # noqa: BLE001  (a sample that cannot be moved)
                    continue
                kind = None
                if cpu[0] == "call" and tpu[0] != "call":
                    kind = "late"
                elif tpu[0] == "call" and cpu[0] != "call":
                    kind = "extra"
                elif cpu[0] == "call" and cpu[1] != tpu[1]:
                    kind = "message"
                if kind:
                    row = {"op": key, "dtype": str(dtype)[6:], "sample": i, "kind": kind}
                    row.update(cpu=[cpu[0], *(cpu[1] or ())], tpu=[tpu[0], *(tpu[1] or ())])
                    rows.append(row)
                    if progress:
                        print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(r: dict) -> str:
    return " ".join(
        [r["kind"], r["op"], r["dtype"], str(r["sample"]), "cpu:", " | ".join(r["cpu"]), "tpu:", " | ".join(r["tpu"])]
    )


def main(argv=None) -> int:
    faulthandler.enable()  # a crash names the op it happened in
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: " + ",".join(str(d)[6:] for d in DTYPES) + ")")
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--all-dtypes", action="store_true", help="also the dtypes the OpInfo supports on CPU")
    p.add_argument("--skip", help="comma-separated OpInfo names to leave out")
    p.add_argument("--progress", action="store_true", help="OpInfo names and rows to stderr as they come")
    p.add_argument("--out")
    ns = p.parse_args(argv)
    dtypes = [getattr(torch, d) for d in ns.dtypes.split(",")] if ns.dtypes else None
    rows = sweep(
        ns.ops.split(",") if ns.ops else None,
        dtypes,
        ns.samples,
        all_dtypes=ns.all_dtypes,
        skip=ns.skip.split(",") if ns.skip else None,
        progress=ns.progress,
    )
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(rows, f, indent=1)
    for r in rows:
        print(_line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
