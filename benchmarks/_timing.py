"""Interleaved timing: contenders alternate within every repeat, figures are medians.

Each contender is a callable that runs one repeat and returns the seconds it wants
counted. Letting the contender time itself allows a timed region smaller than the
call (the "tpu" record benchmark keeps its flush outside the clock).
"""

import gc
import resource
import statistics
import time

clock = time.perf_counter


def timed(fn, *args):
    """Seconds taken by ``fn(*args)``."""
    t0 = clock()
    fn(*args)
    return clock() - t0


def minor_faults():
    """Minor page faults of this process so far (``getrusage`` ``ru_minflt``).

    A count, not a time: the same at any machine load. A call whose result lands in
    freshly mapped memory pays one fault per 4 KiB page touched (a 16 MiB float32
    result: 4,096), which alone can cost more than the kernel (docs/performance.md, rows25).
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_counted(contenders, iters):
    """Wraps each contender to also count its minor page faults per call.

    ``contenders`` {name: callable running ``iters`` calls, returning seconds}. Returns
    (wrapped contenders, {name: [faults per call, one entry per repeat incl. warm-up]}).
    """
    faults = {name: [] for name in contenders}

    def wrap(name, fn):
        def run():
            before = minor_faults()
            seconds = fn()
            faults[name].append((minor_faults() - before) / iters)
            return seconds

        return run

    return {name: wrap(name, fn) for name, fn in contenders.items()}, faults


def bench_args(doc, quick):
    """Parses ``--repeats`` (default 15; 2 when ``quick``, the docs test's short form) and
    ``--threads`` (default 1, applied with torch.set_num_threads) of a side-by-side benchmark
    whose module docstring is ``doc``."""
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if quick:
        args.repeats = 2
    torch.set_num_threads(args.threads)
    return args


def tpu_against_cpu(fn, dev_args, cpu_args, repeats):
    """Interleaved samples of ``fn`` on "tpu" and CPU tensors: {"tpu": [s], "cpu": [s]}.

    The "tpu" repeat includes recording and the flush (``torch.tpu.synchronize()``),
    as CPU eager computes at the call; its result dies outside the clock.
    """
    import torch

    def run_tpu():
        t0 = clock()
        out = fn(*dev_args)
        torch.tpu.synchronize()
        seconds = clock() - t0
        del out
        return seconds

    def run_cpu():
        return timed(fn, *cpu_args)

    return interleave({"tpu": run_tpu, "cpu": run_cpu}, repeats)


def interleave(contenders, repeats, warmup=1):
    """Run ``repeats`` rounds; in each, every contender runs once, in a rotating order.

    Rotating the order means no contender always runs first (cold caches) or right
    after the same neighbour. The garbage collector runs before every call and is
    off during it, so a collection triggered by one contender is not billed to another; the
    objects alive before the first round are frozen (``gc.freeze``) for the rounds, so that
    collection walks only the rounds' own objects.
    Returns {name: [seconds per repeat]}; ``warmup`` rounds are run first and dropped.
    """
    names = list(contenders)
    samples = {name: [] for name in names}
    # What lives now (torch's modules, the models, the contenders) is frozen, so that each
    # collection below walks only what the rounds made: a full collection walks every object
    # of torch's modules, a pause after which each repeat timed its first steps slow
    # (docs/performance.md, "twothr20").
    gc.collect()
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        for r in range(warmup + repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                gc.collect()
                gc.disable()
                try:
                    seconds = contenders[name]()
                finally:
                    gc.enable()
                if r >= warmup:
                    samples[name].append(seconds)
    finally:
        if not frozen_before:  # a caller's own freeze stays
            gc.unfreeze()
    return samples


def summary(values):
    """Median, quartile half-spread relative to the median, min and max of ``values``."""
    values = sorted(values)
    med = statistics.median(values)
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
    else:
        q1, q3 = values[0], values[-1]
    return {
        "median": med,
        "spread": (q3 - q1) / 2 / med if med else 0.0,
        "min": values[0],
        "max": values[-1],
        "n": len(values),
    }


def paired_ratio(numerator, denominator):
    """Median of per-repeat ratios ``numerator[i] / denominator[i]``.

    Both runs of one repeat saw the same machine state, so pairing them cancels
    slow drifts (thermal, other load) that a ratio of two medians would keep.
    """
    return statistics.median(n / d for n, d in zip(numerator, denominator))
