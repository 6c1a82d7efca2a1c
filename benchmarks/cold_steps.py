"""The training steps right after a pause: each step's wall time, "tpu" and CPU eager alternated.

Builds one of run_all's section-7 training steps (``--model mlp|gpt|cnn``) on "tpu" and on CPU
eager at ``--threads`` (set once), warms both up, then runs ``--rounds`` rounds; in each, every
contender gets the event, then ``--steps`` steps timed one by one. The events, each in turn:

- ``full collection``: ``gc.collect()`` with every object alive (torch's modules: a pause
  of walking the whole heap; what run_all's ``interleave`` did before each timed call until
  it froze the objects alive before its rounds);
- ``frozen collection``: ``gc.collect()`` after ``gc.freeze()`` (what ``interleave`` does now);
- ``sleep 10 ms``: the process idle, other jobs take its cores.

Prints, per event, the median of each step over the rounds (ms) and the ratio of the sums
(cpu/tpu > 1: "tpu" faster). The first steps after a pause cost more on both sides; what
"tpu" pays there beyond CPU eager's is the cold penalty of its own code and data (record,
cache look-up, regions; docs/performance.md, "twothr20"). Under TORCH_TPU_QUICK=1: the small models, 2 rounds. Example:

    python benchmarks/cold_steps.py --model mlp --threads 2
"""

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_all  # noqa: E402  (imports torch_tpu_eager)


def timed_steps(trainer, steps):
    """Wall ms of each of ``steps`` steps of ``trainer`` (the loss read at each, as run_all)."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.steps(1)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def after(event, trainers, rounds, steps):
    """{contender: [median ms of step i after ``event()``]} over ``rounds`` alternated rounds."""
    per = {key: [[] for _ in range(steps)] for key in trainers}
    for r in range(rounds):
        keys = list(trainers)[r % 2 :] + list(trainers)[: r % 2]
        for key in keys:
            event()
            gc.disable()
            try:
                for i, ms in enumerate(timed_steps(trainers[key], steps)):
                    per[key][i].append(ms)
            finally:
                gc.enable()
    return {key: [statistics.median(v) for v in columns] for key, columns in per.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("mlp", "gpt", "cnn"), default="mlp")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads, set once")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5, help="steps timed after each event (run_all's train_steps)")
    args = parser.parse_args()
    quick = bool(run_all.tpu_env.get("TORCH_TPU_QUICK"))
    rounds = min(args.rounds, 2) if quick else args.rounds
    name, trainers = run_all.warm_trainers(args.model, args.threads, quick)
    print(f"{name}, {args.threads} threads: ms per step after the event, median of {rounds} rounds")
    events = (
        ("full collection", gc.collect),
        ("frozen collection", gc.collect),
        ("sleep 10 ms", lambda: time.sleep(0.01)),
    )
    for label, event in events:
        if label == "frozen collection":
            gc.collect()
            gc.freeze()
        t0 = time.perf_counter()
        event()
        event_ms = (time.perf_counter() - t0) * 1e3
        medians = after(event, trainers, rounds, args.steps)
        sums = {key: sum(v) for key, v in medians.items()}
        print(f"{label} ({event_ms:.3g} ms), cpu/tpu of the {args.steps} steps {sums['cpu'] / sums['tpu']:.3f}")
        for key, v in medians.items():
            print(f"  {key:<4}" + "".join(f"{ms:9.3f}" for ms in v) + f"   sum {sums[key]:.2f}")
    gc.unfreeze()


if __name__ == "__main__":
    main()
