"""Helpers shared by the example programs: device checks, comparison, metrics report."""

import math


def pyplot(flag, path):
    """matplotlib.pyplot on the file-only Agg backend, or None (after saying so) when
    matplotlib is not installed; ``flag`` and ``path`` name the option that asked for a plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{flag} {path}: matplotlib is not installed; skipping the plot (pip install matplotlib)")
        return None
    return plt


def save_figure(fig, path, what):
    """Lays out ``fig``, writes it to ``path`` (PNG, 120 dpi) and says so; returns True."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"saved {what} plot to {path}")
    return True


def quick_default():
    """Whether --quick is on by default: the TORCH_TPU_QUICK knob (python -m torch_tpu_eager.env),
    which the docs-command test sets so every documented command runs its short form."""
    try:
        from torch_tpu_eager import env
    except ImportError:  # a CPU-only run before the extension is built
        return False
    return env.get("TORCH_TPU_QUICK")


def require_device(device, package, import_error):
    """Fail with a clear message when ``device`` needs torch_tpu_eager and it did not import.

    ``package`` is the imported module or None; ``import_error`` is the exception raised
    by the import (or None). A CPU run needs neither, so the examples stay usable before
    the extension is built.
    """
    if device.split(":")[0] == "cpu":
        return
    if package is None:
        raise RuntimeError(f"device {device!r} needs torch_tpu_eager, which failed to import: {import_error!r}")


def rel_diff(value, reference):
    """Relative difference of ``value`` from ``reference`` (absolute when the reference is ~0)."""
    if math.isnan(value) or math.isnan(reference):
        return math.inf
    return abs(value - reference) / max(abs(reference), 1e-12)


def device_metrics(device, package):
    """Return ``package.metrics()`` for a non-CPU device run, or None when there is nothing to report."""
    if device.split(":")[0] == "cpu" or package is None or not hasattr(package, "metrics"):
        return None
    return package.metrics()


def reset_device_metrics(device, package):
    """Zero the device counters before a run so the report covers that run only."""
    if device.split(":")[0] != "cpu" and package is not None and hasattr(package, "reset_metrics"):
        package.reset_metrics()


def print_fusion_metrics(metrics, n_steps):
    """Print what deferral and fusion did during a run; ``n_steps`` is the optimizer steps taken."""
    if metrics is None:
        print("fusion metrics: none (CPU run)")
        return

    def get(key):
        return metrics.get(key, "n/a")

    ops = metrics.get("ops_recorded")
    regions = metrics.get("regions_run")
    flushes = metrics.get("flushes")
    print("fusion metrics (device run):")
    print(f"  ops recorded       {get('ops_recorded')}")
    print(f"  regions run        {get('regions_run')}")
    ops_per_region = metrics.get("ops_per_region")
    if ops_per_region is None and isinstance(ops, int) and isinstance(regions, int) and regions:
        ops_per_region = ops / regions
    if isinstance(ops_per_region, float):
        ops_per_region = f"{ops_per_region:.2f}"
    print(f"  ops per region     {ops_per_region if ops_per_region is not None else 'n/a'}")
    print(f"  flushes            {get('flushes')}")
    reasons = metrics.get("flush_reasons") or {}
    for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"    {reason:<24} {count}")
    print(f"  cache hits         {get('cache_hits')}")
    print(f"  compiles           {get('compiles')}")
    if "bytes_materialized" in metrics:
        print(f"  bytes materialized {metrics['bytes_materialized']}")
    if isinstance(ops, int) and n_steps:
        print(f"  ops per step       {ops / n_steps:.1f}")
    if isinstance(flushes, int) and n_steps:
        print(f"  flushes per step   {flushes / n_steps:.2f}")
