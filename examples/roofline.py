"""Roofline of the simulated targets (every TPU chip and Spyre): square matmuls of growing size and a training step.

For every target, prints the simulated time of square matmuls (bf16, and float32 at
matmul precision "highest" = 6 bf16 MXU passes and "medium" = 1 pass) and the fraction
of the chip's 16-bit peak they reach (TPU: the bf16 MXU peak; Spyre: the df16 PE-array
peak); then one training step (forward, loss, backward, Adam) of the 64-128-64-10 MLP of
train_digits.py on synthetic data. Times come from the simulator's cost model
(torch_tpu_eager.profile), not from the host clock.

    python examples/roofline.py                  # every target, n = 128 .. 2048
    python examples/roofline.py --quick          # two targets, n <= 512 (for tests)
    python examples/roofline.py --plot out.png   # also save a roofline plot (needs matplotlib)
"""

import argparse
import sys
from pathlib import Path

import torch

import torch_tpu_eager as tte

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find _common however we are loaded
from _common import pyplot, quick_default, save_figure  # noqa: E402

SIZES = [128, 256, 512, 1024, 2048]
QUICK_SIZES = [128, 256, 512]
QUICK_TARGETS = ["tpu-v5e", "tpu-v6e"]
# (label, dtype, float32 matmul precision)
MATMUL_KINDS = [
    ("bf16", torch.bfloat16, "highest"),
    ("f32 highest", torch.float32, "highest"),
    ("f32 medium", torch.float32, "medium"),
]
BATCH = 64


def measure(fn):
    """Runs fn() under the profiler; returns (simulated seconds, FLOPs, HBM bytes, kernels).

    fn's result is held until the profiler's final flush: a value nobody can read
    is dead code and never runs.
    """
    torch.tpu.synchronize()
    with tte.profile() as prof:
        result = fn()  # noqa: F841
    ks = prof.kernels
    hbm = sum(k["bytes_read"] + k["bytes_written"] + k["padding_bytes"] for k in ks)
    return prof.total_sim_time_s, sum(k["flops"] for k in ks), hbm, ks


def matmul_point(n, dtype, precision):
    """Simulated cost of one n x n x n matmul on the active target."""
    a = torch.randn(n, n).to(dtype).to("tpu")
    b = torch.randn(n, n).to(dtype).to("tpu")
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        return measure(lambda: a @ b)
    finally:
        torch.set_float32_matmul_precision(old)


def mlp_step_point(seed=0):
    """Simulated cost of one training step of the digits MLP (synthetic batch of 64)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    ).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.rand(BATCH, 64, generator=g).to("tpu")
    y = torch.randint(0, 10, (BATCH,), generator=g).to("tpu")

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    step()  # first step: Adam state is created, regions compile
    return measure(step)


def roofline_of(info):
    """(peak FLOP/s of 16-bit matmuls, memory bandwidth in bytes/s, one-line description).

    TPU: the chip's bf16 peak and HBM bandwidth. Spyre: 2 FLOP per MAC at the
    datasheet rate per core (matmul_peak_mac_per_ns_per_core) times the cores, and
    the LPDDR5 aggregate peak (dram_bandwidth_spec); both from targets/spyre.json.
    """
    if info["kind"] == "spyre":
        peak = 2 * info["matmul_peak_mac_per_ns_per_core"] * 1e9 * info["cores"]
        bw = info["dram_bandwidth_spec"]
        return (
            peak,
            bw,
            (
                f"{peak / 1e12:.0f} TFLOP/s df16, {bw / 1e9:.0f} GB/s LPDDR5, "
                f"{info['cores']} cores x {info['corelets_per_core']} corelets of "
                f"{info['pe_array_rows']}x{info['pe_array_cols']} PEs, ridge {peak / bw:.0f} FLOP/byte"
            ),
        )
    peak, bw = info["peak_bf16_flops"], info["hbm_bandwidth"]
    return (
        peak,
        bw,
        (
            f"{peak / 1e12:.0f} TFLOP/s bf16, {bw / 1e9:.0f} GB/s HBM, "
            f"{info['tensor_cores']} TensorCore(s) x {info['mxus_per_core']} MXUs of "
            f"{info['mxu_size']}x{info['mxu_size']}, ridge {peak / bw:.0f} FLOP/byte"
        ),
    )


def launch_note(info, kernels):
    """The step's launch overhead where the chip data has one (TPU's launch_s; Spyre's
    cost model has no per-kernel launch term)."""
    if "launch_s" not in info:
        return ""
    return f", launch cost {kernels * info['launch_s'] * 1e6:.0f} us"


def run_target(name, sizes):
    """Prints the table of one target; returns its points for the plot."""
    tte.set_target(name)
    info = tte.target_info()
    peak, bw, description = roofline_of(info)
    print(f"\n{name}: {description}")
    print(f"  {'matmul':<12} {'n':>5} {'sim us':>10} {'TFLOP/s':>9} {'% of peak':>9}  bound")
    points = []
    for label, dtype, precision in MATMUL_KINDS:
        for n in sizes:
            t, flops, hbm, ks = matmul_point(n, dtype, precision)
            bound = "compute" if sum(k["compute_s"] for k in ks) >= sum(k["memory_s"] for k in ks) else "memory"
            tflops, pct = flops / t / 1e12, 100 * flops / t / peak
            print(f"  {label:<12} {n:>5} {t * 1e6:>10.2f} {tflops:>9.2f} {pct:>8.1f}%  {bound}")
            points.append((label, flops / hbm, flops / t))
    t, flops, hbm, ks = mlp_step_point()
    mem_bound = sum(k["memory_s"] > k["compute_s"] for k in ks)
    print(
        f"  digits MLP training step (batch {BATCH}): {len(ks)} kernels, {t * 1e6:.2f} us, "
        f"{flops / 1e6:.2f} MFLOP, {100 * flops / t / peak:.3f}% of peak, "
        f"{mem_bound}/{len(ks)} kernels memory-bound" + launch_note(info, len(ks))
    )
    points.append(("MLP step", flops / hbm, flops / t))
    return {"peak": peak, "bw": bw, "points": points}


def plot(results, path):
    """Saves a log-log roofline (achieved FLOP/s against FLOP per HBM byte) per target."""
    plt = pyplot("--plot", path)
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = {"bf16": "o", "f32 highest": "s", "f32 medium": "^", "MLP step": "*"}
    xs = [p[1] for r in results.values() for p in r["points"]]
    lo, hi = min(xs) / 2, max(max(xs) * 2, max(r["peak"] / r["bw"] for r in results.values()) * 4)
    for i, (name, r) in enumerate(results.items()):
        color = f"C{i}"
        ridge = r["peak"] / r["bw"]
        ax.plot([lo, ridge, hi], [lo * r["bw"], r["peak"], r["peak"]], color=color, label=name)
        for label, intensity, achieved in r["points"]:
            ax.scatter([intensity], [achieved], color=color, marker=markers[label], s=30)
    for label, m in markers.items():
        ax.scatter([], [], color="gray", marker=m, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte, padding included)")
    ax.set_ylabel("achieved FLOP/s (simulated)")
    ax.set_title("Simulated roofline: square matmuls and a digits-MLP training step")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path, "roofline")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", default=quick_default(), help="two targets and n <= 512")
    parser.add_argument("--targets", nargs="*", help="targets to run (default: all)")
    parser.add_argument("--plot", metavar="PNG", help="save a roofline plot (needs matplotlib)")
    args = parser.parse_args(argv)
    names = args.targets or (QUICK_TARGETS if args.quick else tte.list_targets())
    sizes = QUICK_SIZES if args.quick else SIZES
    previous = tte.get_target()
    try:
        results = {name: run_target(name, sizes) for name in names}
    finally:
        tte.set_target(previous)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
