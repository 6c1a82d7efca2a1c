"""Thread CPU time per phase of a run_all training step: "tpu", CPU eager and torch.compile side by side.

Builds one of run_all's section-7 training steps (``--model mlp|gpt|cnn``) three times from
the same seed (on "tpu", on CPU eager, and on CPU under torch.compile with the optimizer eager,
as run_all times them), warms each up, then runs ``--blocks`` interleaved blocks of ten steps
and prints the median thread CPU time per step (ms) of each phase:

- ``forward``: the model's forward and loss;
- ``backward``: ``zero_grad`` and ``loss.backward()``;
- ``clip``: ``clip_grad_norm_(1.0)`` (the steps that clip);
- ``optimizer``: ``opt.step()``;
- ``loss read``: ``loss.item()``.

On "tpu" the phases before the loss read only record (the queue flushes at the read), so the
loss read holds the whole step's execution; ``--sync`` ends every tpu phase with
``torch.tpu.synchronize()`` instead, which charges each phase its own execution but flushes four
times a step (other region boundaries than the benchmark's). Thread time is what the step costs
the core, less sensitive to other jobs than wall time; it counts the calling thread only, so it
is the whole step's cost at ``--threads 1`` (the default) and not at more threads. Example
(under TORCH_TPU_QUICK=1: the small models, 3 blocks):

    python benchmarks/step_phases.py --model gpt --blocks 15
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_all  # noqa: E402  (imports torch_tpu_eager)

PHASES = ("forward", "backward", "clip", "optimizer", "loss read")
STEPS_PER_BLOCK = 10


def timed_step(trainer, sync):
    """One training step of ``trainer`` (run_all.StepTrainer); returns each phase's thread seconds."""
    xb, yb = trainer.batches[trainer.i % len(trainer.batches)]
    trainer.i += 1
    marks = [time.thread_time()]
    loss = trainer.fn(xb, yb)
    sync()
    marks.append(time.thread_time())
    trainer.opt.zero_grad(set_to_none=True)
    loss.backward()
    sync()
    marks.append(time.thread_time())
    if trainer.clip:
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
        sync()
    marks.append(time.thread_time())
    trainer.opt.step()
    sync()
    marks.append(time.thread_time())
    loss.item()
    marks.append(time.thread_time())
    return [b - a for a, b in zip(marks, marks[1:])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("mlp", "gpt", "cnn"), default="gpt")
    parser.add_argument("--blocks", type=int, default=15, help="interleaved blocks of 10 steps per contender")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (only the calling thread is timed)"
    )
    parser.add_argument("--sync", action="store_true", help="synchronize the tpu queue at the end of every phase")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    args = parser.parse_args()
    quick = bool(run_all.tpu_env.get("TORCH_TPU_QUICK"))
    blocks = min(args.blocks, 3) if quick else args.blocks
    name, trainers = run_all.warm_trainers(args.model, args.threads, quick, compiled=not args.no_compile)
    samples = {key: [[] for _ in PHASES] for key in trainers}
    for _ in range(blocks):
        for key, trainer in trainers.items():
            sync = torch.tpu.synchronize if key == "tpu" and args.sync else (lambda: None)
            sums = [0.0] * len(PHASES)
            for _ in range(STEPS_PER_BLOCK):
                sums = [s + t for s, t in zip(sums, timed_step(trainer, sync))]
            for per_phase, total in zip(samples[key], sums):
                per_phase.append(total / STEPS_PER_BLOCK)
    print(
        f"{name}: thread CPU ms per step, median of {blocks} blocks of {STEPS_PER_BLOCK} steps, "
        f"{args.threads} thread(s){', tpu synchronized per phase' if args.sync else ''}"
    )
    keys = list(trainers)
    ratios = [k for k in keys if k != "tpu"]
    print(f"{'phase':<10}" + "".join(f"{k:>10}" for k in keys) + "".join(f"{k + '/tpu':>13}" for k in ratios))
    rows = [(phase, [samples[k][i] for k in keys]) for i, phase in enumerate(PHASES)]
    rows.append(("step", [[sum(block) for block in zip(*samples[k])] for k in keys]))
    for phase, per_key in rows:
        medians = [statistics.median(v) * 1e3 for v in per_key]
        cells = "".join(f"{m:10.3f}" for m in medians)
        if phase == "step":  # the ratio of whole steps; a phase's ratio on tpu without --sync means little
            cells += "".join(f"{medians[keys.index(k)] / medians[0]:13.3f}" for k in ratios)
        print(f"{phase:<10}{cells}")


if __name__ == "__main__":
    main()
