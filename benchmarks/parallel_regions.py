"""Critical path of a run_all training step at N threads: serial work and each parallel region, "tpu" and CPU eager.

Builds one of run_all's section-7 training steps (``--model mlp|gpt|cnn``) on "tpu" and on CPU
eager from the same seed, warms both up at ``--threads`` (default 2; the thread count is never
changed afterwards: switching it between blocks wakes and regroups the pool and slows the regions
after it), then runs ``--blocks`` interleaved blocks of ten steps. Every OpenMP parallel region
(``GOMP_parallel``: at::parallel_for, oneDNN, MKL) is timed per thread by benchmarks/gomp_regions.c,
which this script compiles with ``cc`` and preloads (it re-runs itself under ``LD_PRELOAD``).
Per step (median of the blocks, ms, thread CPU time):

- ``calling thread``: the calling thread's CPU time;
- ``outside regions``: the part of it outside parallel regions (record, Python, serial kernels);
- ``regions, calling thread`` / ``other threads`` / ``largest thread``: the regions' bodies;
- ``regions, fork and join``: the calling thread's CPU time in the regions beside their bodies
  (waking the pool, waiting for it: spinning, or in the kernel with OMP_WAIT_POLICY=PASSIVE);
- ``critical path``: outside regions + the largest thread's time of each region (the step with
  a core for each thread, without fork and join costs);
- ``regions`` (per step) and ``step wall``, ``regions wall`` (wall time: the load's, see below).

Thread CPU time does not grow while a thread waits for a core, but on a machine loaded far past
its cores it grows several times over (5-8x at load 23 here, cause not measured), and the fork
and join time then holds the spinning of a thread whose partner has no core: for wall-like
figures run it alone, or at real-time priority (``chrt -f 10``, root). ``--regions`` adds
a table of the region kinds (calls, CPU time per thread, wall; names from ``addr2line``).
Example (under TORCH_TPU_QUICK=1: the small models, 2 blocks):

    python benchmarks/parallel_regions.py --model cnn --threads 2 --regions
"""

import argparse
import collections
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "PARALLEL_REGIONS_SHIM"  # set in the re-run process: the shim's path
STEPS_PER_BLOCK = 10
FIELDS = ("calls", "caller", "others", "max", "call", "wall")


def rerun_with_shim():
    """Compiles gomp_regions.c and runs this script again with it preloaded; returns its exit status."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("parallel_regions.py needs a C compiler (cc) to build benchmarks/gomp_regions.c")
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "gomp_regions.so")
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", lib, str(HERE / "gomp_regions.c"), "-ldl"], check=True)
        env = dict(os.environ, LD_PRELOAD=lib, **{MARK: lib})
        return subprocess.run([sys.executable, *sys.argv], env=env).returncode


def read_kinds(shim):
    """{"library+0xoffset": [calls, caller s, others s, max s, call s, wall s]} of the regions counted so far."""
    out = {}
    buf = (ctypes.c_double * len(FIELDS))()
    for i in range(shim.gomp_regions_kinds()):
        shim.gomp_regions_get(i, buf)
        out[shim.gomp_regions_where(i).decode()] = list(buf)
    return out


def symbol(where):
    """The function at "library+0xoffset" (addr2line, demangled), or the library and offset."""
    lib, _, offset = where.rpartition("+")
    name = ""
    if shutil.which("addr2line") and lib:
        result = subprocess.run(["addr2line", "-f", "-C", "-e", lib, offset], capture_output=True, text=True)
        name = result.stdout.split("\n")[0]
    short = os.path.basename(lib)
    return f"{short}: {name}" if name and name != "??" else f"{short}+{offset}"


def measure(trainers, shim, blocks):
    """Per contender: {figure: [per-step seconds of each block]} and {region kind: per-step sums}."""
    figures = {key: collections.defaultdict(list) for key in trainers}
    kinds = {key: collections.defaultdict(lambda: [0.0] * len(FIELDS)) for key in trainers}
    for _ in range(blocks):
        for key, trainer in trainers.items():
            shim.gomp_regions_reset()
            shim.gomp_regions_count(1)
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            trainer.steps(STEPS_PER_BLOCK)
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            shim.gomp_regions_count(0)
            regions = read_kinds(shim)
            calls, caller, others, largest, call, region_wall = (
                sum(v[i] for v in regions.values()) for i in range(len(FIELDS))
            )
            per_step = {
                "calling thread": cpu,
                "outside regions": cpu - call,
                "regions, calling thread": caller,
                "regions, other threads": others,
                "regions, largest thread": largest,
                "regions, fork and join": call - caller,
                "critical path": cpu - call + largest,
                "regions": calls * 1e-3,  # a count: printed times 1e3 as the figures are
                "step wall": wall,
                "regions wall": region_wall,
            }
            for name, value in per_step.items():
                figures[key][name].append(value / STEPS_PER_BLOCK)
            for where, values in regions.items():
                sums = kinds[key][where]
                for i, v in enumerate(values):
                    sums[i] += v / STEPS_PER_BLOCK / blocks
    return figures, kinds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("mlp", "gpt", "cnn"), default="cnn")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads, set once")
    parser.add_argument("--blocks", type=int, default=9, help="interleaved blocks of 10 steps per contender")
    parser.add_argument("--regions", action="store_true", help="also list the region kinds of each contender")
    args = parser.parse_args()
    if MARK not in os.environ:
        sys.exit(rerun_with_shim())

    sys.path.insert(0, str(HERE))
    import run_all  # imports torch_tpu_eager

    shim = ctypes.CDLL(os.environ[MARK])
    shim.gomp_regions_where.restype = ctypes.c_char_p
    quick = bool(run_all.tpu_env.get("TORCH_TPU_QUICK"))
    blocks = min(args.blocks, 2) if quick else args.blocks
    name, trainers = run_all.warm_trainers(args.model, args.threads, quick)
    figures, kinds = measure(trainers, shim, blocks)
    print(f"{name}, {args.threads} threads: per step, median of {blocks} blocks of {STEPS_PER_BLOCK} steps")
    print(f"{'ms (thread CPU time unless wall)':<34}{'tpu':>9}{'cpu':>9}{'cpu/tpu':>9}")
    for figure in figures["tpu"]:
        tpu, cpu = (statistics.median(figures[key][figure]) for key in ("tpu", "cpu"))
        ratio = f"{cpu / tpu:9.3f}" if tpu > 0 else f"{'-':>9}"
        print(f"{figure:<34}{tpu * 1e3:9.3f}{cpu * 1e3:9.3f}{ratio}")
    if args.regions:
        for key in ("tpu", "cpu"):
            print(f"\n{key}: region kinds, per step (us), by largest thread's time")
            print(f"{'calls':>6}{'caller':>9}{'others':>9}{'largest':>9}{'call':>9}{'wall':>9}  function")
            for where, v in sorted(kinds[key].items(), key=lambda kv: -kv[1][3]):
                cells = f"{v[0]:6.1f}" + "".join(f"{x * 1e6:9.1f}" for x in v[1:])
                print(f"{cells}  {symbol(where)[:150]}")


if __name__ == "__main__":
    main()
