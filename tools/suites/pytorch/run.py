#!/usr/bin/env python
"""Run PyTorch 2.4.0 test files on "cpu" or "tpu" surviving crashes and hangs; compare runs.

The test files are PyTorch's and are not in this repository: they are fetched into
WORK/tests (tools/suites/README.md); results go to WORK/results/<tag>. WORK is --work,
else $SUITE_WORK, else /work/suites/pytorch. This directory's tests/conftest.py is copied
into WORK/tests before each run.

  python tools/suites/pytorch/run.py --device cpu --tag cpu
  python tools/suites/pytorch/run.py --device tpu --tag main --pythonpath /work/main
  python tools/suites/pytorch/run.py --report --tag main      # against results/cpu
"""

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_WORK = "/work/suites/pytorch"
FILES = [
    "test_view_ops",
    "test_indexing",
    "test_shape_ops",
    "test_type_promotion",
    "test_tensor_creation_ops",
    "test_torch",
    "test_nn",
    "test_reductions",
    "test_binary_ufuncs",
    "test_unary_ufuncs",
    "test_foreach",
    "test_sort_and_select",
    "test_scatter_gather_ops",
]
K = {"test_nn": "TestNNDeviceType"}  # its other classes use CPU tensors
# test_ops.py (OpInfo, 31,659 tests per device) is not in FILES: run it with --files test_ops,
# a family at a time (-k test_out etc.); OPS_SELECT keeps TestCommon's float32 tests (and the
# dtype-less ones, test_out_warning / test_errors), not the Python references (_refs.*).
OPS_SELECT = r"^test_(?!python_ref)\w+_(cpu|tpu)(_float32)?$"
# (select, deselect) regexes on the test function's name: subsets of the huge OpInfo files.
_FAMILIES = r"^test_(non_contig|reference_numerics|contig|batch_vs)"
_UNARY = (
    "abs neg exp log sqrt rsqrt sigmoid tanh sin cos erf floor round reciprocal sign log1p "
    "expm1 nan_to_num frac bitwise_not logical_not square trunc ceil atan sinh logit "
    "nn_functional_gelu nn_functional_silu nn_functional_relu"
).split()
_BINARY = (
    "add sub mul div_no_rounding_mode div_trunc_rounding div_floor_rounding remainder fmod pow "
    "maximum minimum atan2 eq ne lt ge bitwise_and bitwise_xor logical_and floor_divide "
    "copysign hypot xlogy lerp clamp_min fmax true_divide heaviside nextafter ldexp"
).split()


def _subset(ops):
    keep = "|".join(ops)
    return (
        rf"^(?!test_(non_contig|reference_numerics|contig|batch_vs))|"
        rf"^test_\w+?_({keep})_(cpu|tpu)_",
        r"_refs_",
    )


SUBSET = {
    "test_reductions": (None, r"_refs_"),
    "test_unary_ufuncs": _subset(_UNARY),
    "test_binary_ufuncs": _subset(_BINARY),
    "test_ops": (OPS_SELECT, r"__refs_"),
}
K["test_ops"] = "TestCommon"


def outcomes(path):
    """nodeid -> (outcome, message) from a JSON-lines log; started-unfinished ones too."""
    res, started = {}, []
    if not os.path.exists(path):
        return res, started
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec["event"] == "start":
                started.append(rec["nodeid"])
            else:
                res[rec["nodeid"]] = (rec["outcome"], rec.get("msg", ""))
    return res, [n for n in started if n not in res]


def _append(path, nodeid, outcome, msg):
    with open(path, "a") as f:
        rec = {"event": "outcome", "nodeid": nodeid, "outcome": outcome, "msg": msg}
        f.write(json.dumps(rec) + "\n")


def run_file(args, name, outdir):
    log = os.path.join(outdir, name + ".jsonl")
    out = os.path.join(outdir, name + ".out")
    if args.fresh:
        for p in (log, out):
            if os.path.exists(p):
                os.remove(p)
    env = dict(os.environ)
    env.update(
        SUITE_DEVICE=args.device,
        SUITE_LOG=log,
        PYTORCH_TESTING_DEVICE_ONLY_FOR=args.device,
        SUITE_BYPASS="1" if args.bypass else "0",
        SUITE_CPU_DTYPES="1" if args.cpu_dtypes else "0",
    )
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    # An installed torch_tpu_eager registers a torch.backends entry point: without this,
    # `import torch` loads it in the CPU reference too (pin_memory works, torch patched).
    if args.device == "cpu" and not args.autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    sel, desel = SUBSET.get(name, (None, None))
    if args.select:
        sel = args.select
    for key, val in (("SUITE_SELECT", sel), ("SUITE_DESELECT", desel)):
        if val:
            env[key] = val
        else:
            env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rN",
        f"--timeout={args.timeout}",
        "--timeout-method=signal",
        f"tests/{name}.py",
    ]
    k = args.k or K.get(name)
    if k:
        cmd += ["-k", k]
    last_crash = None
    while True:
        t0 = time.time()
        with open(out, "a") as fo:
            proc = subprocess.Popen(
                cmd, cwd=args.work, env=env, stdout=fo, stderr=subprocess.STDOUT, start_new_session=True
            )
            hung = False
            while proc.poll() is None:
                time.sleep(2)
                last = max(os.path.getmtime(p) for p in (log, out) if os.path.exists(p))
                if time.time() - max(last, t0) > args.timeout + args.grace:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    hung = True
        _, pending = outcomes(log)
        if not pending:
            print(f"  {name}: pytest exited {proc.returncode}", flush=True)
            return
        victim = pending[-1]
        kind = "hang" if hung else "crashed"
        _append(log, victim, kind, f"{kind}: exit {proc.returncode}")
        print(f"  {name}: {kind} in {victim}; restarting", flush=True)
        if victim == last_crash:
            return
        last_crash = victim


_DEV = re.compile(r"(CPU|PRIVATEUSE1|TPU)$")


def key(nodeid):
    """A test's name with the device removed: class suffix and the last _cpu/_tpu token."""
    parts = nodeid.split("::")
    if len(parts) >= 3:
        parts[1] = _DEV.sub("", parts[1])
    name = parts[-1]
    toks = name.split("_")
    for i in range(len(toks) - 1, 0, -1):
        if toks[i] in ("cpu", "tpu"):
            del toks[i]
            break
    parts[-1] = "_".join(toks)
    return "::".join(parts)


def report(args):
    ref_dir = os.path.join(args.work, "results", args.ref)
    dev_dir = os.path.join(args.work, "results", args.tag)
    lines, rows = [], []
    match = re.compile(args.match) if args.match else None
    for name in args.files:
        ref, _ = outcomes(os.path.join(ref_dir, name + ".jsonl"))
        dev, _ = outcomes(os.path.join(dev_dir, name + ".jsonl"))
        if not ref or not dev:
            continue
        rk = {key(n): v for n, v in ref.items()}
        dk = {key(n): v for n, v in dev.items()}
        cpu_pass = [k for k, v in rk.items() if v[0] == "passed" and (match is None or match.search(k))]
        c = collections.Counter()
        for k in sorted(cpu_pass):
            o = dk.get(k, ("not generated", ""))
            c[o[0]] += 1
            if o[0] != "passed":
                lines.append(f"{name} {o[0]:13s} {k.split('::', 1)[-1]}  | {o[1][:200]}")
        dev_total = collections.Counter(v[0] for v in dk.values())
        rows.append((name, len(cpu_pass), c, dev_total))
    print(f"| file | CPU-passing | {args.tag} passed | failed | skipped | not generated | other |")
    print("|---|---|---|---|---|---|---|")
    for name, n, c, _ in rows:
        other = sum(v for k, v in c.items() if k not in ("passed", "failed", "skipped", "not generated"))
        print(f"| {name} | {n} | {c['passed']} | {c['failed']} | {c['skipped']} | {c['not generated']} | {other} |")
    path = os.path.join(dev_dir, "failures.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"differences: {path} ({len(lines)} lines)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["cpu", "tpu"])
    p.add_argument("--tag", required=True)
    p.add_argument(
        "--work",
        default=os.environ.get("SUITE_WORK", DEFAULT_WORK),
        help=f"directory holding tests/ (fetched test files) and results/ (default $SUITE_WORK or {DEFAULT_WORK})",
    )
    p.add_argument("--ref", default="cpu", help="tag of the CPU reference for --report")
    p.add_argument("--pythonpath")
    p.add_argument("--files", nargs="+", default=FILES)
    p.add_argument("-k")
    p.add_argument(
        "--select", help="regex on the test's name replacing the file's subset (test_ops: float32 tests only)"
    )
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--bypass", action="store_true")
    p.add_argument(
        "--cpu-dtypes",
        action="store_true",
        help="tpu: generate the dtypes a test's @dtypesIfCPU lists (tests CPU-only dtype lists leave out)",
    )
    p.add_argument(
        "--autoload", action="store_true", help="cpu: let torch autoload installed device backends (off by default)"
    )
    p.add_argument("--grace", type=int, default=120)
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--report", action="store_true")
    p.add_argument("--match", help="--report: count only the tests whose name matches this regex")
    args = p.parse_args()
    if args.report:
        report(args)
        return
    if args.device is None:
        p.error("--device or --report")
    args.work = os.path.abspath(args.work)
    outdir = os.path.join(args.work, "results", args.tag)
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(os.path.join(args.work, "tests"), exist_ok=True)
    # Our conftest must sit beside PyTorch's files for pytest to load it.
    shutil.copyfile(os.path.join(HERE, "tests", "conftest.py"), os.path.join(args.work, "tests", "conftest.py"))
    for name in args.files:
        if not os.path.exists(os.path.join(args.work, "tests", name + ".py")):
            print(f"  {name}: no tests/{name}.py, skipped", flush=True)
            continue
        t = time.time()
        print(f"{name} on {args.device} ...", flush=True)
        run_file(args, name, outdir)
        print(f"  {name}: {time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
