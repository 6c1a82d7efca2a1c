"""Warm training steps of benchmarks/run_all.py (section 7) for a profiler.

Builds one of the three training steps (``mlp``, ``gpt``, ``cnn``) on one device,
warms it up, then runs ``--steps`` steps on one thread (``--threads``). ``--model digits``
runs run_all's section 5 digits MLP + Adam step (loss read every 10 steps); ``--model llama`` the
2-layer llama's forward + loss + backward of benchmarks/llama_step.py (needs transformers). ``--model flush`` instead
records run_all's 16-op chain on a 4x4 tensor and flushes it (``--steps`` times, every
flush a cache hit); ``--model record`` records 1000 ``a + b`` on 1-element tensors per
step and flushes them outside the profiled part (``--op`` picks another op: ``mul`` for
``a.mul(b)``, ``add_`` for the in-place ``a.add_(b)``, ``addcmul_`` for
``a.addcmul_(b, b, value=0.5)``, ``view`` for ``a.view(1)``). Under callgrind, start with
collection off and let the script switch it on around the timed steps only:

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.%p \\
        python benchmarks/profile_step.py --model cnn --device tpu --steps 5 --callgrind

(``--callgrind`` runs ``callgrind_control -i on`` / ``-i off`` on this process around
the steps). Without a profiler it prints the wall time per step.
"""

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_all  # noqa: E402  (imports torch_tpu_eager)


def toggle(args, state):
    """Switches callgrind's instrumentation of this process on or off (with --callgrind)."""
    if args.callgrind:
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)


def micro(args):
    """The flush or record micro-benchmark; returns (name, profiled seconds)."""
    sync = torch.tpu.synchronize if args.device == "tpu" else (lambda: None)
    if args.model == "flush":
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).to(args.device)
        for _ in range(args.warmup):
            run_all.chain16(x)
            sync()
        seconds = 0.0
        for i in range(args.steps):
            y = run_all.chain16(x)
            if i == 0:
                toggle(args, "on")
            t0 = time.perf_counter()
            sync()
            seconds += time.perf_counter() - t0
            del y
        toggle(args, "off")
        return "flush of a 16-op chain (cache hit)", seconds
    a, b = torch.tensor([1.5]).to(args.device), torch.tensor([-0.25]).to(args.device)
    if args.device == "tpu":  # no auto-flush inside the recorded ops
        run_all.torch_tpu_eager.set_queue_limits(max_ops=10**6, max_bytes=run_all.torch_tpu_eager.queue_limits()[1])
    label, loop = RECORD_OPS[args.op]
    for _ in range(args.warmup):
        loop(a, b, 1000)
        sync()
    toggle(args, "on")
    seconds = 0.0
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loop(a, b, 1000)
        seconds += time.perf_counter() - t0
        sync()
    toggle(args, "off")
    return f"record of 1000 {label}", seconds


def _record_add_(a, b, n):
    for _ in range(n):
        a.add_(b)


def _record_addcmul_(a, b, n):
    for _ in range(n):
        a.addcmul_(b, b, value=0.5)


def _record_view(a, b, n):
    for _ in range(n):
        a.view(1)


# --model record's ops (--op): label and the loop that records n of them.
RECORD_OPS = {
    "add": ("a + b", run_all._record_add),
    "mul": ("a.mul(b)", run_all._record_mul),
    "add_": ("a.add_(b)", _record_add_),
    "addcmul_": ("a.addcmul_(b, b, value=0.5)", _record_addcmul_),
    "view": ("a.view(1)", _record_view),
}


class _LlamaTrainer:
    """benchmarks/llama_step.py's step on one device, with the ``steps(n)`` of run_all's trainers."""

    def __init__(self, step):
        self.step = step

    def steps(self, n):
        for _ in range(n):
            self.step()


def llama_trainer(device):
    """The 2-layer llama step of benchmarks/llama_step.py on ``device`` ("tpu" or "cpu")."""
    import llama_step

    built = llama_step.build()
    if built is None:  # as llama_step.py: say so and exit 0
        print("profile_step: --model llama needs transformers, which is not installed")
        raise SystemExit(0)
    model, ids = built
    sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
    return _LlamaTrainer(llama_step.make_step(model.to(device), ids.to(device), sync))


def compare_record(args):
    """Interleaved blocks of ``--op`` recorded 2,000 times (as run_all's record rows) on tpu
    and run on cpu: median thread CPU time per op, microseconds, and of the tpu/cpu ratios."""
    import statistics

    n = 2000
    label, loop = RECORD_OPS[args.op]
    run_all.torch_tpu_eager.set_queue_limits(max_ops=10**6, max_bytes=run_all.torch_tpu_eager.queue_limits()[1])
    tensors = {d: (torch.tensor([1.5]).to(d), torch.tensor([-0.25]).to(d)) for d in ("tpu", "cpu")}
    times = {d: [] for d in tensors}
    for b in range(args.warmup + args.compare):
        for d in tensors if b % 2 == 0 else reversed(list(tensors)):
            torch.tpu.synchronize()  # the flush is not timed: recording only
            t0 = time.thread_time()
            loop(*tensors[d], n)
            if b >= args.warmup:
                times[d].append((time.thread_time() - t0) / n)
    torch.tpu.synchronize()
    ratios = [t / c for t, c in zip(times["tpu"], times["cpu"])]
    print(
        f"record of {n} {label}: thread us/op tpu {statistics.median(times['tpu']) * 1e6:.3f}, cpu "
        f"{statistics.median(times['cpu']) * 1e6:.3f}, tpu/cpu {statistics.median(ratios):.3f} "
        f"(median of {args.compare} blocks)"
    )


def compare_flush(args):
    """BLOCKS blocks of 300 cache-hit flushes of run_all's 16-op chain on a 4x4 tensor (the
    chain recorded off the clock, its flush timed): median thread CPU time per flush,
    microseconds (what the flush costs the core; CPU eager has no counterpart)."""
    import statistics

    n = 300
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).to("tpu")
    for _ in range(max(args.warmup, 20)):
        run_all.chain16(x)
        torch.tpu.synchronize()
    blocks = []
    for _ in range(args.compare):
        seconds = 0.0
        for _ in range(n):
            y = run_all.chain16(x)
            t0 = time.thread_time()
            torch.tpu.synchronize()
            seconds += time.thread_time() - t0
            del y
        blocks.append(seconds / n)
    print(
        f"flush of a 16-op chain (cache hit): thread us/flush {statistics.median(blocks) * 1e6:.3f} "
        f"(median of {args.compare} blocks of {n}; min {min(blocks) * 1e6:.3f})"
    )


def compare(args):
    """Interleaved blocks of training steps on tpu and cpu: median thread CPU time per step."""
    import statistics

    if args.model == "record":
        compare_record(args)
        return
    if args.model == "flush":
        compare_flush(args)
        return
    if args.model == "digits":
        name, batches = "digits MLP + Adam step", run_all.digits_data(10)[0]
        trainers = {d: run_all.Trainer(d, batches) for d in ("tpu", "cpu")}
    else:
        index = {"mlp": 0, "gpt": 1, "cnn": 2}[args.model]
        name, make_model, make_opt, clip, make_batches = run_all._training_cases(False)[index]
        batches = make_batches()
        trainers = {d: run_all.StepTrainer(d, make_model, make_opt, clip, batches) for d in ("tpu", "cpu")}
    for t in trainers.values():
        t.steps(args.warmup)
    times = {d: [] for d in trainers}
    faults = {d: 0 for d in trainers}
    for b in range(args.compare):
        order = list(trainers) if b % 2 == 0 else list(reversed(list(trainers)))
        for d in order:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.thread_time()
            trainers[d].steps(args.steps)
            times[d].append((time.thread_time() - t0) / args.steps)
            faults[d] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    ratios = [c / t for c, t in zip(times["cpu"], times["tpu"])]
    n = args.compare * args.steps
    print(
        f"{name}: CPU ms/step tpu {statistics.median(times['tpu']) * 1e3:.3f}, cpu "
        f"{statistics.median(times['cpu']) * 1e3:.3f}, cpu/tpu {statistics.median(ratios):.3f} "
        f"(median of {args.compare} blocks of {args.steps}); page faults/step tpu {faults['tpu'] / n:.1f}, "
        f"cpu {faults['cpu'] / n:.1f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("mlp", "gpt", "cnn", "digits", "llama", "flush", "record"), default="cnn")
    parser.add_argument(
        "--device", default="tpu", help='"tpu", "cpu", or "compile" (torch.compile on CPU; training steps only)'
    )
    parser.add_argument("--op", choices=tuple(RECORD_OPS), default="add", help="--model record: the op recorded")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="BLOCKS",
        help="training steps: interleave BLOCKS blocks of --steps steps on tpu and on cpu in this "
        "process and print the median CPU time per step of each (thread time: what the step costs "
        "the core, less sensitive to other jobs than wall time) and their ratio; --model record: "
        "the same for BLOCKS blocks of 2,000 --op records (tpu) and runs (cpu), per op; --model flush: "
        "BLOCKS blocks of 300 cache-hit flushes, thread time per flush",
    )
    parser.add_argument("--callgrind", action="store_true", help="toggle callgrind collection around the steps")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1); under callgrind add --separate-threads=yes and "
        "OMP_WAIT_POLICY=PASSIVE to count each thread's own work without the pool's spinning",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("highest")
    if args.compare:
        compare(args)
        return
    if args.model in ("flush", "record"):
        name, seconds = micro(args)
    else:
        if args.model == "digits":
            name, trainer = "digits MLP + Adam step", run_all.Trainer(args.device, run_all.digits_data(10)[0])
        elif args.model == "llama":
            name, trainer = "2-layer llama forward + backward", llama_trainer(args.device)
        else:
            index = {"mlp": 0, "gpt": 1, "cnn": 2}[args.model]
            name, make_model, make_opt, clip, make_batches = run_all._training_cases(False)[index]
            compiled = args.device == "compile"  # torch.compile (inductor) on CPU; optimizer eager
            device = "cpu" if compiled else args.device
            trainer = run_all.StepTrainer(device, make_model, make_opt, clip, make_batches(), compiled=compiled)
        trainer.steps(args.warmup)
        toggle(args, "on")
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        trainer.steps(args.steps)
        seconds = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        toggle(args, "off")
        user, system = (r1.ru_utime - r0.ru_utime) / args.steps, (r1.ru_stime - r0.ru_stime) / args.steps
        print(
            f"per step: user {user * 1e3:.3f} ms, system {system * 1e3:.3f} ms, "
            f"minor page faults {(r1.ru_minflt - r0.ru_minflt) / args.steps:.1f}"
        )
    print(f"{name} on {args.device}: {seconds / args.steps * 1e3:.3f} ms/step (wall) over {args.steps} steps")


if __name__ == "__main__":
    main()
