"""Simulated time per training step, split by what bounds it, as a stacked-bar PNG.

Trains the 64-128-64-10 MLP of train_digits.py (Adam, batch 64, UCI digits) on "tpu"
for --steps steps, each under ``torch_tpu_eager.profile()``, and draws one stacked bar
per step from the simulated kernels of that step:

- TPU targets: a kernel's time is its launch cost plus the roofline time
  max(compute, memory). The bar stacks the roofline time of compute-bound kernels,
  that of memory-bound kernels, and the launch cost of all of them.
- Spyre: a kernel's time is T = C + M - 0.46 min(C, M) (the overlap law in
  targets/spyre.json). The bar stacks compute C, load (the share of M of the bytes
  read) and store (the share of M of the bytes written), each scaled by T / (C + M) so
  that the bar's height is the simulated step time.

The first step (Adam's state is created, regions compile) is drawn like the others;
simulated time does not include host compile time.

    python examples/plot_step_time.py --out step_time.png [--target spyre] [--steps 12]
"""

import argparse
import sys
from pathlib import Path

import torch

import torch_tpu_eager as tte

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find _common however we are loaded
from _common import pyplot, quick_default, save_figure  # noqa: E402
from train_digits import load_data, make_model

BATCH = 64


def split_tpu(kernels):
    """{'compute-bound': s, 'memory-bound': s, 'launch': s} of one step's TPU kernels (seconds)."""
    parts = {"compute-bound": 0.0, "memory-bound": 0.0, "launch": 0.0}
    for k in kernels:
        roofline = max(k["compute_s"], k["memory_s"])
        parts["compute-bound" if k["compute_s"] >= k["memory_s"] else "memory-bound"] += roofline
        parts["launch"] += k["sim_time_s"] - roofline
    return parts


def split_spyre(kernels):
    """{'compute': s, 'load': s, 'store': s} of one step's Spyre kernels (seconds, summing to
    the simulated time)."""
    parts = {"compute": 0.0, "load": 0.0, "store": 0.0}
    for k in kernels:
        c, m = k["compute_s"], k["memory_s"]
        if c + m <= 0:
            continue
        scale = k["sim_time_s"] / (c + m)
        moved = k["bytes_read"] + k["bytes_written"]
        read_share = k["bytes_read"] / moved if moved else 0.5
        parts["compute"] += c * scale
        parts["load"] += m * read_share * scale
        parts["store"] += m * (1 - read_share) * scale
    return parts


def profile_steps(steps, seed=0):
    """Trains ``steps`` steps on "tpu"; returns (per-step part dicts, per-step losses)."""
    torch.manual_seed(seed)
    x_train, y_train, _, _ = load_data(seed)
    model = make_model().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    split = split_spyre if tte.target_info()["kind"] == "spyre" else split_tpu
    parts, losses = [], []
    for step in range(steps):
        lo = (step * BATCH) % (len(x_train) - BATCH)
        x = x_train[lo : lo + BATCH].to("tpu")
        y = y_train[lo : lo + BATCH].to("tpu")
        with tte.profile() as prof:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            torch.tpu.synchronize()
        parts.append(split(prof.kernels))
    return parts, losses


def plot(parts, target, path):
    """Saves the stacked bars to ``path`` (PNG). Returns False when matplotlib is missing."""
    plt = pyplot("--out", path)
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = list(range(1, len(parts) + 1))
    bottom = [0.0] * len(parts)
    for i, name in enumerate(parts[0]):
        heights = [p[name] * 1e6 for p in parts]
        ax.bar(steps, heights, bottom=bottom, label=name, color=f"C{i}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xlabel("training step")
    ax.set_ylabel("simulated time (us)")
    ax.set_title(f"Digits MLP + Adam, batch {BATCH}: simulated step time on {target}")
    ax.set_xticks(steps)
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, path, "step-time")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="step_time.png", help="PNG to write (default step_time.png)")
    parser.add_argument("--target", default=None, help="simulated target (default: the active one)")
    parser.add_argument(
        "--steps",
        type=int,
        default=4 if quick_default() else 12,
        help="training steps (default 12; 4 with TORCH_TPU_QUICK=1)",
    )
    args = parser.parse_args(argv)
    if args.target:
        tte.set_target(args.target)
    target = tte.get_target()
    parts, losses = profile_steps(args.steps)
    print(f"{'step':>4} {'loss':>8} " + " ".join(f"{name + ' us':>18}" for name in parts[0]) + f" {'total us':>10}")
    for i, (p, loss) in enumerate(zip(parts, losses), 1):
        print(
            f"{i:>4} {loss:>8.4f} "
            + " ".join(f"{v * 1e6:>18.2f}" for v in p.values())
            + f" {sum(p.values()) * 1e6:>10.2f}"
        )
    plot(parts, target, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
