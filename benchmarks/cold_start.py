"""Cold start with and without the on-disk cache (TORCH_TPU_CACHE_DIR).

Each sample is a fresh process that imports torch_tpu_eager and runs the first
training step of a tiny MLP (64 -> 128 -> 10, batch 32, SGD with momentum), or
with --program infer its forward pass and loss only.
It reports the seconds to move the model and batch to "tpu" and build the
optimizer ("setup"), to record the step (forward, backward, optimizer: this is
where PyTorch's meta kernels run on an in-memory miss; the first such call in
a process imports PyTorch's Python meta registrations and their dependencies),
to flush it (the JIT: partition, region compile or cache lookup, execution),
and "first", the sum: the time from import to the first trained step.
Contenders, interleaved: "off" (no cache dir), "cold" (an empty cache dir:
every entry is looked up, missed and appended) and "warm" (a dir filled by an
earlier process). Each figure is the median of --repeats processes. Every
process checks its step against CPU PyTorch.

    python benchmarks/cold_start.py [--repeats 7] [--program train|infer] [--cpu-first]

``--program steps`` times the first training step of each of the three steps of
benchmarks/run_all.py section 7 (MLP + Adam, nanoGPT + AdamW + clip, CNN + BN + SGD
momentum) and of its digits MLP (section 5) and char-LM (section 6) steps (one thread),
each contender in a fresh process: "tpu" against CPU eager,
interleaved, medians of --repeats processes and the median of the per-repeat ratios
tpu / cpu (issue 18's target: <= 1.5). "setup" moves the model and batches and builds
the optimizer (PyTorch's optimizer constructor imports torch._dynamo: not billed to
the step); "first" is the first step with its loss read to the host; "second" the
next step, for scale. For "tpu" it also reports, from metrics(), the JIT's compile
time (``compile_time_s``), compiles and kernel plans built during the first step. With
``--profile NAME`` it instead runs one "tpu" process of that case (mlp, gpt, cnn,
digits or charlm) under cProfile and prints the first step's top functions by
cumulative time.

``--program first-op`` instead times whole processes, interleaved: the line
``import torch, torch_tpu_eager; (torch.ones(3, device='tpu') + 1).cpu()`` against
``import torch; (torch.ones(3) + 1).cpu()``, and prints the medians and their ratio
(the start-up target is 1.15x; docs/performance.md).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, time
t0 = time.perf_counter()
import torch
import torch.nn.functional as F
import torch_tpu_eager
t_import = time.perf_counter() - t0
g = torch.Generator().manual_seed(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
cpu_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
cpu_model.load_state_dict(model.state_dict())
x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)

train = os.environ.get("COLD_START_PROGRAM") == "train"
if train:
    # PyTorch's optimizer constructor imports torch._dynamo (over a second here): a
    # cost of every training program, paid before the clock starts.
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)

def cpu_step():
    # Correctness first: the same program on CPU.
    cpu_loss = F.cross_entropy(cpu_model(x), y)
    if train:
        cpu_loss.backward()
        cpu_opt.step()
    return cpu_loss.detach()

cpu_first = os.environ.get("COLD_START_CPU_FIRST") == "1"
if cpu_first:
    cpu_loss = cpu_step()  # PyTorch's own CPU kernels warm before the timed step
t_setup = time.perf_counter()
model = model.to("tpu")
if train:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
xd, yd = x.to("tpu"), y.to("tpu")
torch_tpu_eager.synchronize()
t1 = time.perf_counter()
loss = F.cross_entropy(model(xd), yd)
if train:
    opt.zero_grad()
    loss.backward()
    opt.step()
t2 = time.perf_counter()
torch_tpu_eager.synchronize()
t3 = time.perf_counter()
if not cpu_first:
    cpu_loss = cpu_step()
torch.testing.assert_close(loss.cpu(), cpu_loss)
for p, q in zip(model.parameters(), cpu_model.parameters()):
    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
m = torch_tpu_eager.metrics()
print(json.dumps({"import": t_import, "setup": t1 - t_setup, "record": t2 - t1, "flush": t3 - t2,
                  "first": t3 - t_setup,
                  "hits": m["disk_cache_hits"], "compiles": m["compiles"]}))
"""


STEPS_CHILD = r"""
import json, os, sys, time
import torch
import torch_tpu_eager
sys.path.insert(0, os.path.join(os.environ["COLD_START_ROOT"], "benchmarks"))
import run_all

torch.set_num_threads(1)
case = os.environ["COLD_START_CASE"]
device = os.environ["COLD_START_DEVICE"]
# Data and the example's module are built before the clock starts, as run_all builds them.
if case == "digits":
    batches, _ = run_all.digits_data(n_batches=10)
    name = "digits MLP 64-128-64-10 + Adam, batch 64"
    build = lambda: run_all.Trainer(device, batches)
elif case == "charlm":
    lm = run_all._char_lm()
    data, itos = lm.load_text()
    gen = torch.Generator().manual_seed(run_all.SEED + 1)
    batches = [lm.get_batch(data, lm.Config(vocab_size=len(itos)).block_size, gen) for _ in range(10)]
    name = f"char-LM + AdamW + clip, batch {lm.BATCH_SIZE}"
    build = lambda: run_all.LMTrainer(lm, device, batches, len(itos))
else:
    name, make_model, make_opt, clip, make_batches = run_all._training_cases(False)[("mlp", "gpt", "cnn").index(case)]
    batches = make_batches()
    build = lambda: run_all.StepTrainer(device, make_model, make_opt, clip, batches)
t0 = time.perf_counter()
trainer = build()
if device != "cpu":
    torch_tpu_eager.synchronize()
m0 = torch_tpu_eager.metrics()
t1 = time.perf_counter()
profile = os.environ.get("COLD_START_PROFILE") == "1"
if profile:
    import cProfile, pstats
    prof = cProfile.Profile()
    prof.enable()
loss = trainer.step().item()
t2 = time.perf_counter()
if profile:
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
m1 = torch_tpu_eager.metrics()
trainer.step().item()
t3 = time.perf_counter()
d = {k: m1[k] - m0[k] for k in ("compile_time_s", "compiles", "plans_built", "ops_recorded", "flushes")}
print(json.dumps({"name": name, "setup": t1 - t0, "first": t2 - t1, "second": t3 - t2, "loss": loss, **d}))
"""

# run_all.py section 7's three steps, then its digits MLP (5.) and char-LM (6.) steps.
STEP_CASES = ("mlp", "gpt", "cnn", "digits", "charlm")
# With TORCH_TPU_QUICK=1 (the docs' commands under test, 300 s each on a loaded machine):
# one case of each kind of trainer, unless --case names others.
QUICK_STEP_CASES = ("mlp", "charlm")


def run_steps_child(case, device, profile=False):
    """One fresh process running the first two steps of ``case`` (a STEP_CASES name) on ``device``."""
    env = dict(os.environ, COLD_START_ROOT=ROOT, COLD_START_CASE=case, COLD_START_DEVICE=device)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TORCH_TPU_CACHE_DIR", None)
    if profile:
        env["COLD_START_PROFILE"] = "1"
    out = subprocess.run([sys.executable, "-c", STEPS_CHILD], env=env, capture_output=True, text=True, check=True)
    if profile:
        print(out.stdout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_steps(repeats, cases=STEP_CASES):
    """First training step of each of ``cases`` (STEP_CASES names), "tpu" vs CPU, a fresh process each."""
    print(
        f"{'step':44}{'cpu ms':>9}{'tpu ms':>9}{'tpu/cpu':>9}{'compile ms':>11}{'compiles':>9}"
        f"{'plans':>7}{'cpu 2nd':>9}{'tpu 2nd':>9}"
    )
    for case in cases:
        rows = {"cpu": [], "tpu": []}
        for r in range(repeats):
            for dev in ("cpu", "tpu") if r % 2 else ("tpu", "cpu"):
                rows[dev].append(run_steps_child(case, dev))
        ratio = statistics.median(t["first"] / c["first"] for t, c in zip(rows["tpu"], rows["cpu"]))
        med = lambda dev, k: statistics.median(x[k] for x in rows[dev])  # noqa: E731
        print(
            f"{rows['tpu'][0]['name'][:43]:44}{1e3 * med('cpu', 'first'):9.1f}{1e3 * med('tpu', 'first'):9.1f}"
            f"{ratio:9.2f}{1e3 * med('tpu', 'compile_time_s'):11.1f}{med('tpu', 'compiles'):9.0f}"
            f"{med('tpu', 'plans_built'):7.0f}{1e3 * med('cpu', 'second'):9.1f}{1e3 * med('tpu', 'second'):9.1f}"
        )


def run_child(cache_dir, cpu_first=False, program="train"):
    env = dict(os.environ)
    env["COLD_START_PROGRAM"] = program
    env["COLD_START_CPU_FIRST"] = "1" if cpu_first else "0"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TORCH_TPU_CACHE_DIR", None)
    if cache_dir:
        env["TORCH_TPU_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


FIRST_OP = {
    "cpu": "import torch; (torch.ones(3) + 1).cpu()",
    "tpu": "import torch, torch_tpu_eager; (torch.ones(3, device='tpu') + 1).cpu()",
}


def first_op(repeats):
    """Wall seconds of a whole ``python -c`` process per line of FIRST_OP, interleaved;
    prints the median of each and the median of the per-repeat ratios tpu / cpu."""
    import time

    samples = {name: [] for name in FIRST_OP}
    for r in range(repeats + 1):  # the first round warms the page cache and is dropped
        for name in list(FIRST_OP) if r % 2 else list(FIRST_OP)[::-1]:
            t0 = time.perf_counter()
            # CPU's line must not autoload the extension through torch's backend entry point.
            env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0") if name == "cpu" else None
            subprocess.run([sys.executable, "-c", FIRST_OP[name]], check=True, env=env)
            if r:
                samples[name].append(time.perf_counter() - t0)
    ratios = [t / c for t, c in zip(samples["tpu"], samples["cpu"])]
    for name, line in FIRST_OP.items():
        print(f'{name}  {1e3 * statistics.median(samples[name]):8.1f} ms  python -c "{line}"')
    print(f"tpu / cpu: {statistics.median(ratios):.3f} (median of {repeats} interleaved pairs)")


def quick():
    """The TORCH_TPU_QUICK knob of the registry (python -m torch_tpu_eager.env)."""
    sys.path.insert(0, ROOT)
    from torch_tpu_eager import env

    return env.get("TORCH_TPU_QUICK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--repeats",
        type=int,
        default=1 if quick() else 7,
        help="processes per figure (default 7; with TORCH_TPU_QUICK=1 1, and at most 1)",
    )
    ap.add_argument(
        "--program",
        choices=("train", "infer", "first-op", "steps"),
        default="train",
        help="train: one SGD step; infer: the forward pass and loss only (no torch.optim import); "
        "first-op: whole processes running one op, against CPU; "
        "steps: the first step of run_all.py's training steps (sections 5-7), against CPU",
    )
    ap.add_argument(
        "--profile",
        choices=STEP_CASES,
        help="with --program steps: profile the first tpu step of this case (cProfile) instead",
    )
    ap.add_argument(
        "--case",
        action="append",
        choices=STEP_CASES,
        help="with --program steps: time only this case (repeatable; default all; "
        "with TORCH_TPU_QUICK=1, mlp and charlm)",
    )
    ap.add_argument(
        "--cpu-first",
        action="store_true",
        help="run the CPU reference step before the timed one, so the flush is not billed for "
        "the first use of PyTorch's CPU kernels (oneDNN/MKL/OpenMP start-up)",
    )
    args = ap.parse_args()
    if quick():  # smoke run (docs' commands under test): one process per figure
        args.repeats = min(args.repeats, 1)
    if args.program == "first-op":
        first_op(args.repeats)
        return
    if args.program == "steps":
        if args.profile:
            run_steps_child(args.profile, "tpu", profile=True)
        else:
            first_steps(args.repeats, args.case or (QUICK_STEP_CASES if quick() else STEP_CASES))
        return
    tmp = tempfile.mkdtemp(prefix="tpu_cold_start_")
    try:
        warm_dir = os.path.join(tmp, "warm")
        run_child(warm_dir, args.cpu_first, args.program)  # fills it
        samples = {"off": [], "cold": [], "warm": []}
        for r in range(args.repeats):
            names = list(samples)[r % 3 :] + list(samples)[: r % 3]
            for name in names:
                d = {"off": None, "cold": os.path.join(tmp, f"cold{r}"), "warm": warm_dir}[name]
                res = run_child(d, args.cpu_first, args.program)
                if name == "warm":
                    assert res["compiles"] == 0 and res["hits"] > 0, res
                samples[name].append(res)
        cols = ("import", "setup", "record", "flush", "first")
        print(f"{'cache':6}" + "".join(f"{c + ' ms':>11}" for c in cols))
        for name, rows in samples.items():
            print(f"{name:6}" + "".join(f"{1e3 * statistics.median(r[c] for r in rows):11.1f}" for c in cols))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
