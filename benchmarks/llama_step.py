"""The 2-layer llama training step (issue 18's target: warm step <= 1.0x CPU), "tpu" against CPU.

transformers' ``LlamaForCausalLM``: 2 layers, hidden 64, FFN 128, 4 heads (2 key-value
heads), vocab 512, SDPA attention; token ids ``(2, 16)`` used as labels too, so a step is
the forward, the language-model loss and the backward (gradients set to None first, as
``zero_grad()`` does). One thread. Both devices are warmed up, then run in alternating
pairs (the order flips every pair); each step is timed by the process's CPU time, the
calling thread's CPU time and wall time (on a loaded machine wall time mostly measures the
wait for a core). The "tpu" step ends in ``torch.tpu.synchronize()``: its gradients are
computed when the step ends, as on CPU. Printed: the median of each clock on each device,
the median of the per-pair ratios tpu / CPU, and what one warm "tpu" step runs (kernels
from the metrics' ``regions_run``, ops recorded, ops run through their CPU kernels); the
loss and the 21 gradients are compared with CPU's first.

transformers is optional (not a dependency of the package): without it the script says so
and exits 0. ``--kernels`` lists the kernels of one warm step by name (the profiler's).

    PYTHONPATH=. python benchmarks/llama_step.py [--pairs 40] [--kernels]

TORCH_TPU_QUICK=1 runs 3 pairs.
"""

import argparse
import collections
import copy
import gc
import os
import statistics
import sys
import time

import torch

QUICK = os.environ.get("TORCH_TPU_QUICK") == "1"
CLOCKS = {"process": time.process_time, "thread": time.thread_time, "wall": time.perf_counter}

# transformers imports torchvision where it is installed; torchvision 0.28.0's only wheel is a
# CUDA build whose C ops do not load on CPU torch, and its import fails unless the two op
# schemas tvshim defines exist (without this, LlamaConfig raises ModuleNotFoundError).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "suites", "models"))
import tvshim  # noqa: E402,F401


def build(seed=0):
    """The CPU model and its token ids (2, 16), both from ``seed``; None without transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    return model, ids


def make_step(model, ids, sync):
    """One training step of ``model`` on ``ids``: returns the loss (computed when it returns)."""

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        sync()
        return loss

    return step


def compare(cpu_model, tpu_model, cpu_loss, tpu_loss):
    """(loss bit-equal, gradients bit-equal, number of gradients, largest relative difference)."""
    same, worst = 0, 0.0
    grads = [(p.grad, q.grad.cpu()) for p, q in zip(cpu_model.parameters(), tpu_model.parameters())]
    for g, h in grads:
        torch.testing.assert_close(h, g, rtol=1e-4, atol=1e-5)
        same += int(torch.equal(g, h))
        worst = max(worst, ((g - h).abs().max() / g.abs().max().clamp_min(1e-30)).item())
    torch.testing.assert_close(tpu_loss.cpu(), cpu_loss)
    return torch.equal(tpu_loss.cpu(), cpu_loss), same, len(grads), worst


def warm_step_counts(step, torch_tpu_eager):
    """What one warm "tpu" step runs: (kernels, ops recorded, ops through CPU kernels)."""
    torch_tpu_eager.reset_metrics()
    step()
    m = torch_tpu_eager.metrics()
    by_op_count = sum(n for name, n in torch_tpu_eager._C._op_counts() if name.startswith("op_by_op."))
    return m["regions_run"], m["ops_recorded"], by_op_count


def kernel_table(step, torch_tpu_eager):
    """Kernels of one warm step by name, most frequent first, with their op counts."""
    with torch_tpu_eager.profile() as prof:
        step()
    names = collections.Counter(k["name"] for k in prof.kernels)
    ops = collections.Counter()
    for k in prof.kernels:
        ops[k["name"]] += len(k["ops"])
    lines = [f"{len(prof.kernels)} kernels, {sum(ops.values())} ops"]
    lines += [f"  {n:3d} x {name} ({ops[name] // n} ops)" for name, n in names.most_common()]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40, help="alternating pairs of timed steps (3 when quick)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per device")
    parser.add_argument("--kernels", action="store_true", help="list the kernels of one warm tpu step")
    args = parser.parse_args()
    pairs = 3 if QUICK else args.pairs
    built = build()
    if built is None:
        print("llama_step: transformers is not installed; nothing to measure (pip install transformers)")
        return
    import torch_tpu_eager

    torch.set_num_threads(1)
    cpu_model, ids = built
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    steps = {
        "cpu": make_step(cpu_model, ids, lambda: None),
        "tpu": make_step(tpu_model, ids.to("tpu"), torch.tpu.synchronize),
    }
    losses = {}
    for device, step in steps.items():
        for _ in range(max(1, args.warmup)):
            losses[device] = step()
    loss_equal, same, n_grads, worst = compare(cpu_model, tpu_model, losses["cpu"], losses["tpu"])
    kernels, recorded, by_op = warm_step_counts(steps["tpu"], torch_tpu_eager)

    samples = {(d, c): [] for d in steps for c in CLOCKS}
    for p in range(pairs):
        for device in ("cpu", "tpu") if p % 2 == 0 else ("tpu", "cpu"):
            gc.collect()
            gc.disable()
            t0 = {c: clock() for c, clock in CLOCKS.items()}
            steps[device]()
            t1 = {c: clock() for c, clock in CLOCKS.items()}
            gc.enable()
            for c in CLOCKS:
                samples[device, c].append(t1[c] - t0[c])

    print(
        f"llama 2L seq16, {pairs} pairs, one thread, load {os.getloadavg()[0]:.1f}; loss "
        f"{'bit-equal' if loss_equal else 'close'} to CPU, {same}/{n_grads} gradients bit-equal "
        f"(largest relative difference {worst:.2g})"
    )
    print(f"warm tpu step: {kernels} kernels, {recorded} ops recorded", end="")
    print(f", {by_op} through CPU kernels" if by_op else " (TORCH_TPU_DEBUG=1 counts the ops run op by op)")
    print(f"{'clock':8} | {'cpu ms':>7} | {'tpu ms':>7} | tpu/cpu (median of pair ratios)")
    for c in CLOCKS:
        cpu_s, tpu_s = samples["cpu", c], samples["tpu", c]
        ratio = statistics.median(t / max(s, 1e-9) for s, t in zip(cpu_s, tpu_s))
        print(f"{c:8} | {statistics.median(cpu_s) * 1e3:7.3f} | {statistics.median(tpu_s) * 1e3:7.3f} | {ratio:.3f}")
    if args.kernels:
        print(kernel_table(steps["tpu"], torch_tpu_eager))


if __name__ == "__main__":
    sys.exit(main())
