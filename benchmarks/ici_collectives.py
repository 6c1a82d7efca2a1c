"""Collectives on the simulated chip interconnect (ICI): simulated time and bus bandwidth.

For every TPU target, all_reduce / all_gather / reduce_scatter of 1, 4, 16, 64 and 256 MiB
over 2, 4 and 8 chips: the slice shape the group is laid out on, the algorithm the cost
model picks, the simulated time (torch_tpu_eager.ici.collective_cost: alpha-beta model on
the chip's published ICI numbers) and the bus bandwidth (nccl-tests' definition: bytes /
time x 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter), which is
comparable with the link bandwidth whatever the group size. Nothing is timed: the
figures are the model's, identical on every machine.

``--host`` also measures the host throughput of all_reduce between processes on this host
(bytes/s through the c10d backend tpu_ccl, beside gloo's own on CPU tensors) next to the
simulated ICI time, 1-256 MiB: :func:`host_all_reduce_throughput`.

    python benchmarks/ici_collectives.py                   # every TPU target
    python benchmarks/ici_collectives.py --target tpu-v5e  # one target
    python benchmarks/ici_collectives.py --host            # + host all_reduce, 2 processes
    python benchmarks/run_all.py --only ici                # the same table from the benchmark runner
"""

import argparse
import sys

MiB = 2**20
SIZES_MIB = (1, 4, 16, 64, 256)
GROUPS = (2, 4, 8)
OPS = ("all_reduce", "all_gather", "reduce_scatter")


def simulated_rows(targets=None, sizes_mib=SIZES_MIB, groups=GROUPS, ops=OPS):
    """One dict per (target, op, chips, size): ``target``, ``op``, ``chips``, ``shape``,
    ``algorithm``, ``mib``, ``time_s`` (simulated), ``latency_s``, ``bandwidth_s``,
    ``bus_bandwidth`` and ``alg_bandwidth`` (bytes / time), bytes/s, ``link_bandwidth``."""
    import torch_tpu_eager
    from torch_tpu_eager import ici

    if targets is None:
        targets = [n for n in torch_tpu_eager.list_targets() if torch_tpu_eager.target_info(n)["kind"] == "tpu"]
    rows = []
    for target in targets:
        for op in ops:
            for n in groups:
                for mib in sizes_mib:
                    c = ici.collective_cost(op, mib * MiB, n, target)
                    rows.append(
                        {
                            "target": target,
                            "op": op,
                            "chips": n,
                            "shape": "x".join(map(str, c.shape)),
                            "algorithm": c.algorithm,
                            "mib": mib,
                            "time_s": c.time_s,
                            "latency_s": c.latency_s,
                            "bandwidth_s": c.bandwidth_s,
                            "bus_bandwidth": c.bus_bandwidth,
                            "alg_bandwidth": c.nbytes / c.time_s,
                            "link_bandwidth": c.link_bandwidth,
                        }
                    )
    return rows


def _host_worker(rank, world_size, init_file, sizes_mib, repeats, out):
    """One rank of :func:`host_all_reduce_throughput` (a spawned process)."""
    import os
    import statistics
    import time

    import torch
    import torch.distributed as dist

    import torch_tpu_eager  # noqa: F401  (registers "tpu" and the tpu_ccl backend)
    from torch_tpu_eager import ici

    # One intra-op thread per process, as torchrun sets (OMP_NUM_THREADS=1): with torch's
    # default (one per core) the processes' OpenMP threads spin against each other and a
    # 1 MiB host copy took ~35 ms instead of ~0.05 ms on this loaded 2-core machine.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    device = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(device)
    dist.init_process_group("cpu:gloo,tpu:tpu_ccl", init_method=f"file://{init_file}", rank=rank, world_size=world_size)

    def median_s(t, finish):
        dist.all_reduce(t)  # warm: first-call costs (gloo pairs, buffers) out of the timing
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            finish(t)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    rows = []
    for mib in sizes_mib:
        n = mib * MiB // 4
        host_s = median_s(torch.ones(n, device=device), lambda t: t.view(-1)[:1].cpu())  # back on the device
        gloo_s = median_s(torch.ones(n), lambda t: None)  # the transport alone: gloo on CPU tensors
        rows.append(
            {
                "world_size": world_size,
                "mib": mib,
                "host_s": host_s,
                "host_bandwidth": mib * MiB / host_s,
                "gloo_s": gloo_s,
                "gloo_bandwidth": mib * MiB / gloo_s,
                "target": torch_tpu_eager.get_target(),
                "sim_s": ici.collective_time("all_reduce", mib * MiB, world_size),
            }
        )
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def host_all_reduce_throughput(sizes_mib=SIZES_MIB, world_sizes=(2,), repeats=5):
    """Host all_reduce throughput through the c10d backend "tpu_ccl" between processes on
    this host (torch_tpu_eager.distributed: gloo over host copies of the tensors), beside
    gloo's own on CPU tensors of the same size and the simulated ICI time of the collective.

    For each world size, spawns that many processes (localhost, FileStore, group
    ``"cpu:gloo,tpu:tpu_ccl"``), each with a float32 tensor of every size in ``sizes_mib``
    (MiB) on its chip ``tpu:rank % N`` and one on CPU; times ``repeats`` all_reduce calls of
    each after one warm call, the "tpu" one until the result is back on the device. Returns
    one dict per (world size, size): ``world_size``, ``mib``, ``host_s`` and ``gloo_s``
    (median wall seconds per call: tpu_ccl on "tpu" tensors, gloo on CPU tensors),
    ``host_bandwidth`` and ``gloo_bandwidth`` (tensor bytes / seconds, bytes/s), ``target``
    and ``sim_s`` (simulated seconds of the all_reduce on that many chips of the active
    target, torch_tpu_eager.ici). Wall-clock figures of this machine, unlike ``sim_s``.
    """
    import os
    import tempfile

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows = []
    for world_size in world_sizes:
        with tempfile.TemporaryDirectory() as tmp:
            out = ctx.SimpleQueue()
            mp.start_processes(
                _host_worker,
                args=(world_size, os.path.join(tmp, "store"), tuple(sizes_mib), repeats, out),
                nprocs=world_size,
                start_method="spawn",
            )
            rows.extend(out.get())
    return rows


def format_host_table(rows):
    """The host rows as text: per world size and size (MiB), median ms per all_reduce and GB/s
    through tpu_ccl and through gloo on CPU tensors, and the simulated ICI time (us)."""
    target = rows[0]["target"] if rows else "?"
    lines = [
        "all_reduce, float32: host wall time through tpu_ccl (gloo over host copies) and through gloo on "
        f"CPU tensors, this machine; simulated ICI time on {target}",
        "",
        "processes | MiB | tpu_ccl ms | tpu_ccl GB/s | gloo (CPU) ms | gloo GB/s | simulated ICI us",
    ]
    for r in rows:
        lines.append(
            f"{r['world_size']} | {r['mib']} | {r['host_s'] * 1e3:.2f} | {r['host_bandwidth'] / 1e9:.2f} | "
            f"{r['gloo_s'] * 1e3:.2f} | {r['gloo_bandwidth'] / 1e9:.2f} | {r['sim_s'] * 1e6:.1f}"
        )
    return "\n".join(lines)


def format_table(rows):
    """The rows as text in benchmarks/run_all.py's style (cells joined by " | "): one line
    per target, op and group size; per buffer size, simulated time (us) and bus GB/s."""
    groups = {}
    for r in rows:
        groups.setdefault((r["target"], r["op"], r["chips"]), []).append(r)
    sizes = sorted({r["mib"] for r in rows})
    header = ["target", "op", "chips", "shape", "algorithm", "link GB/s"] + [f"{m} MiB: us, bus GB/s" for m in sizes]
    body = []
    for (target, op, chips), group in groups.items():
        by_size = {r["mib"]: r for r in group}
        algorithms = list(dict.fromkeys(r["algorithm"] for r in group))
        cells = [
            target,
            op,
            str(chips),
            group[0]["shape"],
            "/".join(algorithms),
            f"{group[0]['link_bandwidth'] / 1e9:.0f}",
        ]
        for m in sizes:
            r = by_size.get(m)
            cells.append("-" if r is None else f"{r['time_s'] * 1e6:.1f}, {r['bus_bandwidth'] / 1e9:.1f}")
        body.append(cells)
    widths = [max(len(c[i]) for c in [header] + body) for i in range(len(header))]

    def fmt(cells):
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    lines = [
        "simulated ICI collectives (torch_tpu_eager.ici cost model; not timed: the same on every machine)",
        "per size: simulated time in us, nccl-tests bus bandwidth in GB/s (bytes / time x 2(n-1)/n for "
        "all_reduce, (n-1)/n for all_gather and reduce_scatter); link GB/s: one ICI link, one direction",
        "host all_reduce throughput: python benchmarks/ici_collectives.py --host (host_all_reduce_throughput)",
        "",
        fmt(header),
        "-+-".join("-" * w for w in widths),
    ]
    lines.extend(fmt(r) for r in body)
    return "\n".join(lines)


def main(argv=None):
    """Prints the table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", help="a TPU target (repeatable; default: every TPU target)")
    parser.add_argument("--host", action="store_true", help="also time all_reduce between 2 processes on this host")
    args = parser.parse_args(argv)
    print(format_table(simulated_rows(args.target)))
    if args.host:
        from torch_tpu_eager.env import get as env_get

        sizes = SIZES_MIB[:2] if env_get("TORCH_TPU_QUICK") else SIZES_MIB
        print()
        print(format_host_table(host_all_reduce_throughput(sizes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
