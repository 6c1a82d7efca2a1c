"""Start MKL's vector math (VML) on one thread, so CPU's own transcendental kernels are reproducible.

CPU PyTorch computes float32 sqrt/exp/log/tanh/erf/sin/... of large tensors with MKL VML, split
over the intra-op threads (chunks of 2,048 elements). VML sets itself up lazily on its first call,
and that set-up races when the first call comes from two OpenMP threads at once: in a fraction of
processes the second thread's chunks are computed by a less accurate code path for the rest of
the process (about 4,095 of 4,096 elements of its half differ from the first thread's). The
result is that CPU eager itself gives different numbers from run to run — the reference every
"tpu" result is compared with. Measurements and the reproduction are in docs/cpu_reference.md.

One VML call on a tensor smaller than a chunk runs on the calling thread only, so the set-up
cannot race; every later call, on any thread, then takes the same path.
"""

import torch


def initialize_cpu_vector_math() -> None:
    """Make MKL VML's first call in this process from one thread (a 16-element float32 sqrt).

    Costs one tiny CPU kernel at import. A no-op in effect on builds without MKL. Raises nothing.
    """
    torch.ones(16, dtype=torch.float32).sqrt()
