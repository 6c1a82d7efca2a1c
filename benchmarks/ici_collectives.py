"""Collectives on the simulated chip interconnect (ICI): simulated time and bus bandwidth.

For every TPU target, all_reduce / all_gather / reduce_scatter of 1, 4, 16, 64 and 256 MiB
over 2, 4 and 8 chips: the slice shape the group is laid out on, the algorithm the cost
model picks, the simulated time (torch_tpu_eager.ici.collective_cost: alpha-beta model on
the chip's published ICI numbers) and the bus bandwidth (nccl-tests' definition: bytes /
time x 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter), which is
comparable with the link bandwidth whatever the group size. Nothing is timed: the
figures are the model's, identical on every machine.

Host throughput of all_reduce (bytes/s through the c10d "tpu" backend between processes
on this host) is not measured yet: see :func:`host_all_reduce_throughput`.

    python benchmarks/ici_collectives.py                   # every TPU target
    python benchmarks/ici_collectives.py --target tpu-v5e  # one target
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


def host_all_reduce_throughput(sizes_mib=SIZES_MIB, world_sizes=(2,)):
    """Host all_reduce throughput through the c10d "tpu" backend (bytes/s), to be filled in.

    Not built here: it needs the c10d backend for "tpu" (torch_tpu_eager.distributed,
    issue 20 item 1), which is developed separately. The intended measurement: spawn
    ``world_size`` processes (torch.multiprocessing, localhost), all_reduce a float32
    tensor of each size on "tpu" a few times, and report the median wall time per call
    and bytes / time, beside the simulated ICI time of :func:`simulated_rows`. Returns
    a list of row dicts (``world_size``, ``mib``, ``host_s``, ``host_bandwidth``); for
    now always ``[]``.
    """
    del sizes_mib, world_sizes
    return []


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
        "host all_reduce throughput: not measured (needs the c10d 'tpu' backend; see host_all_reduce_throughput)",
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
    args = parser.parse_args(argv)
    print(format_table(simulated_rows(args.target)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
