"""Spyre: a slice of a mark_dynamic dim over a sweep of sizes (issue 21 item 3).

For each n of the sweep, a fresh ``(16, n)`` float16 tensor marked dynamic at
dim 1 (range 1..512) runs ``d[:, 1:] * d[:, 1:] + 1.0`` on the Spyre target:
the first launch of each shape (a bind of the compiled program, or a new
program when none fits) and then ``--repeats`` warm launches of it. Prints,
per n, ``plans_built`` so far and the thread CPU time of the first and the
median warm launch, then the totals. Run it against another build by
pointing PYTHONPATH at that checkout (the script only uses public API).

    PYTHONPATH=. python benchmarks/spyre_dynamic_slice.py [--shapes 12] [--repeats 5]
"""

import argparse
import os
import statistics
import time

import torch

import torch_tpu_eager as tte


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, default=3 if os.environ.get("TORCH_TPU_QUICK") else 12)
    ap.add_argument("--repeats", type=int, default=2 if os.environ.get("TORCH_TPU_QUICK") else 5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tte.set_target("spyre")
    sizes = [40 + 37 * i for i in range(args.shapes)]
    # Warm the op path once outside the sweep (a size outside the range).
    x = torch.randn(16, 1000).half().to("tpu")
    (x[:, 1:] * x[:, 1:] + 1.0).cpu()
    tte.reset_metrics()
    print(f"{'n':>5} {'plans_built':>11} {'first ms':>9} {'warm ms':>8}")
    firsts, warms = [], []
    for n in sizes:
        a = torch.randn(16, n).half()
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 512)
        t0 = time.thread_time()
        (d[:, 1:] * d[:, 1:] + 1.0).cpu()
        first = time.thread_time() - t0
        w = []
        for _ in range(args.repeats):
            t0 = time.thread_time()
            (d[:, 1:] * d[:, 1:] + 1.0).cpu()
            w.append(time.thread_time() - t0)
        firsts.append(first)
        warms.append(statistics.median(w))
        print(f"{n:>5} {tte.metrics()['plans_built']:>11} {first * 1e3:>9.3f} {warms[-1] * 1e3:>8.3f}")
    m = tte.metrics()
    print(
        f"shapes {len(sizes)}  compiles {m['compiles']}  plans_built {m['plans_built']}  "
        f"first launches {sum(firsts) * 1e3:.2f} ms  warm median {statistics.median(warms) * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
