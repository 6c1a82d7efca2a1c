"""Build torch_tpu_eager._C from csrc/ with torch.utils.cpp_extension (ninja).

Debug info is off by default (it roughly doubles compile time on 2 cores);
set TORCH_TPU_DEBUG_BUILD=1 to build with -g -O0 and the debug checks (the region verifier).
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("TORCH_TPU_DEBUG_BUILD", "0") == "1"

sources = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True))
cxx_flags = ["-std=c++17", "-O0" if DEBUG else "-O2", "-fvisibility=hidden"]
# No fused multiply-add in loop-carried chains of scalars and vectors up to 256
# bits, as torch 2.13's GCC 13 build does by default: ATen's RowwiseMoments
# (inlined in our layer_norm row loop) then rounds bit for bit as CPU's
# LayerNormKernel (tests/executors/tpu/test_fused_layer_norm.py checks it).
cxx_flags.append("--param=avoid-fma-max-bits=256")
# at::parallel_for is a header template: without -fopenmp it compiles to a serial
# loop in this extension (ATen's OpenMP path is under #ifdef _OPENMP), so our fused
# loops would use one core whatever torch.set_num_threads says. The libgomp.so.1 we
# link against resolves to the one torch has already loaded (same soname), so both
# share one thread pool and torch.set_num_threads governs ours too.
cxx_flags.append("-fopenmp")
if DEBUG:
    cxx_flags.append("-g")
    cxx_flags.append("-DTORCH_TPU_DEBUG_BUILD")  # e.g. the region verifier runs on every flush (csrc/jit/verify.h)
else:
    cxx_flags.append("-g0")

setup(
    name="torch_tpu_eager",
    version="0.1.0",
    description="A deferred-and-fused PrivateUse1 'tpu' device for eager PyTorch, simulating TPU and Spyre on the CPU",
    packages=find_packages(include=["torch_tpu_eager", "torch_tpu_eager.*"]),
    package_data={"torch_tpu_eager": ["targets/*.json"]},  # chip data files (set_target)
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "numpy"],
    extras_require={
        "examples": ["scikit-learn", "matplotlib"],
        "test": ["pytest", "hypothesis", "expecttest", "scikit-learn"],
        # torch_tpu_eager.pallas (JAX/Pallas kernels on "tpu"); Pallas's API moves fast: pinned.
        "pallas": ["jax[cpu]==0.10.2"],
    },
    # `import torch` loads the device (PyTorch's device-backend autoload; off with
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0).
    entry_points={"torch.backends": ["tpu = torch_tpu_eager._autoload:load"]},
    ext_modules=[
        CppExtension(
            name="torch_tpu_eager._C",
            sources=sources,
            # + libkineto's headers, shipped with torch: the torch.profiler device tracer
            # (csrc/device/kineto_profiler.cpp)
            include_dirs=[os.path.join(ROOT, "csrc")] + [os.path.join(p, "kineto") for p in include_paths()[:1]],
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
