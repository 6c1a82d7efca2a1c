"""Builds and runs tools/check_sleef_exp.cpp for the AVX2 and AVX512 fused loops:
exp_as_sleef must equal at::vec's exp (SLEEF's expf u10) on all 2^32 float32 values.
Usage: python tools/check_sleef_exp.py  (about a minute per capability; needs g++).
With TORCH_TPU_QUICK=1 it checks every 4096th vector of bit patterns only."""

import os
import subprocess
import sys
import tempfile

import torch
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_and_run(avx512, workdir, quick=False):
    exe = os.path.join(workdir, "check_avx512" if avx512 else "check_avx2")
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    # The extension's own flags (setup.py), so the routine compiles as it does there.
    cmd = [
        "g++",
        "-O2",
        "-w",
        "-std=c++17",
        "-fopenmp",
        "--param=avoid-fma-max-bits=256",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(["-DCHECK_AVX512"] if avx512 else []),
        "-I",
        os.path.join(ROOT, "csrc"),
        *[f"-I{p}" for p in cpp_extension.include_paths()],
        os.path.join(ROOT, "tools", "check_sleef_exp.cpp"),
        os.path.join(ROOT, "csrc", "executors", "tpu", "fused_program.cpp"),
        os.path.join(ROOT, "csrc", "executors", "cpu_vml.cpp"),
        os.path.join(ROOT, "csrc", "executors", "tpu", "fused_convert.cpp"),
        # The AVX-512 unit's layer_norm calls the AVX2 unit's rows (CPU's AVX2 kernel's values).
        *([os.path.join(ROOT, "csrc", "executors", "tpu", "fused_kernels_avx2.cpp")] if avx512 else []),
        f"-L{lib}",
        "-ltorch_cpu",
        "-lc10",
        f"-Wl,-rpath,{lib}",
        "-o",
        exe,
    ]
    subprocess.run(cmd, check=True)
    every = "4096" if quick else "1"
    return subprocess.run([exe, every]).returncode


def main():
    with open("/proc/cpuinfo") as f:
        has_avx512 = "avx512f" in f.read()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from torch_tpu_eager import env

    quick = env.get("TORCH_TPU_QUICK")  # the knob registry (python -m torch_tpu_eager.env)
    with tempfile.TemporaryDirectory() as d:
        failed = [
            name
            for name, avx512 in (("AVX2", False), ("AVX512", True))
            if (has_avx512 or not avx512) and build_and_run(avx512, d, quick) != 0
        ]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
