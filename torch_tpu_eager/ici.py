"""Simulated inter-chip interconnect (ICI): what a collective costs on a TPU slice.

The numbers come from the chip's data file (``torch_tpu_eager/targets/<name>.json``,
keys ``ici_*``, each with its source): bandwidth of one link in one direction,
links per chip, per-hop latency, topology (2D or 3D torus), the largest slice and
when an axis has its wraparound link. :func:`collective_cost` turns them into the
time of one collective with the alpha-beta model (a latency per link hop plus
bytes over link bandwidth); :func:`record_collective` charges that time to a
chip's simulated clock, so ``torch.Event`` pairs and :func:`torch_tpu_eager.profile`
see collectives as they see kernels.

Sizes follow nccl-tests: ``nbytes`` is the size of the whole buffer of one rank —
the tensor of all_reduce / broadcast / reduce, the *output* of all_gather, the
*input* of reduce_scatter, the input of all_to_all, the message of send/recv.

The model, per op (``n`` chips, ``B`` = ``nbytes``, ``b`` = link bandwidth per
direction, ``alpha`` = per-hop latency):

- The group is laid out on the most balanced slice shape with ``n`` chips that fits
  the largest slice (2D for v5e/v6e, 3D for v4/v5p; :func:`slice_shape`), e.g. 8
  chips: 2x4 on v5e, 2x2x2 on v4. An axis has its wraparound link per the chip's
  rule (v5e/v6e: an axis of 16; v4/v5p: every axis a multiple of 4, i.e. whole
  4x4x4 cubes). A group size with no such shape is laid out as a path (no wraparound).
- One axis of ``a`` chips carries a ring: with its wraparound link, two rings in
  opposite directions, each with half the data ("bidirectional ring", bandwidth
  ``2b``, one hop per step); without it, a ring folded onto the line (each link used
  once per direction, bandwidth ``b``, two hops per step; one hop when ``a = 2``).
- all_reduce, reduce_scatter, all_gather: the better of (a) one ring through all
  ``n`` chips (bidirectional when the slice has a Hamiltonian cycle of neighbour
  links: a torus, or a mesh with an even chip count) and (b) the multi-dimensional
  torus algorithm: the buffer is split into one part per axis, part ``j`` reduce-
  scatters along the axes in the order ``j, j+1, ...`` (each phase on ``1/a`` of the
  previous data), so that in every phase each axis carries one part; all_gather is
  the mirror image, all_reduce both. A ring reduce-scatter costs
  ``(a-1)*h*alpha + (a-1)/a * D / (r*b)`` (``D`` the data on that axis, ``r`` 1 or 2,
  ``h`` hops per step), so a ring all_reduce is ``2(a-1)*h*alpha + 2(a-1)/a * B/(r*b)``.
  Sources: ring algorithms, Thakur, Rabenseifner and Gropp, "Optimization of
  Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, and Patarasuk
  and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  JPDC 69(2), 2009; the torus all-reduce, Ying et al., "Image Classification at
  Supercomputer Scale", arXiv:1811.06992, 2018 (2-D torus all-reduce on TPU pods),
  and Austin et al., "How to Scale Your Model", 2025 (per-axis bidirectional rings,
  multi-axis collectives, ~1 us per hop).
- broadcast, reduce: a pipelined ring per axis (root to the farthest chip; the
  buffer streams in chunks): latency of the farthest chip (``ceil((a-1)/2)`` steps on
  a bidirectional ring, ``a-1`` otherwise), bandwidth ``B / (r*b)`` of the slowest
  axis; the better of one ring through all chips and the per-axis tree.
- all_to_all: every chip sends ``B/n`` to every chip along shortest, dimension-
  ordered paths; the busiest link direction of axis ``i`` carries ``B*a_i/8`` bytes
  with a wraparound (``a_i`` even; ``B*(a_i^2-1)/(8*a_i)`` odd), ``(B/a_i)*floor(a_i/2)*ceil(a_i/2)``
  without; the axes work at once; latency: the slice's diameter in hops.
- send / recv: one neighbour link, ``alpha + B/b``.
- barrier: an all_reduce of 0 bytes (latency only).

Not modelled: the reduction arithmetic (it overlaps the transfers and HBM is >10x
faster than ICI), link contention with other traffic, DCN between slices. Spyre has
no published card-to-card interconnect (see targets/spyre.json), so it has no cost.
"""

import contextlib
import dataclasses
import functools
import itertools
import math

from . import target as _target

_NO_SCOPE = contextlib.nullcontext()

# Public op names, and the names torch.distributed / c10d use for them.
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send", "recv", "barrier")
_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_allgather_base": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoall_base": "all_to_all",
    "isend": "send",
    "irecv": "recv",
}
# nccl-tests' bus bandwidth factors (nccl-tests doc/PERFORMANCE.md): bus bandwidth =
# nbytes / time * factor, comparable with the link bandwidth whatever the group size.
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}


@dataclasses.dataclass(frozen=True)
class CollectiveCost:
    """The simulated cost of one collective (see :func:`collective_cost`).

    ``time_s = latency_s + bandwidth_s`` (seconds); ``latency_s = hops * hop latency``;
    ``bandwidth_s = bytes_per_link / link_bandwidth`` where ``bytes_per_link`` is what
    the busiest link carries in one direction (bytes) and ``link_bandwidth`` is bytes/s
    per link per direction. ``shape``: chips per axis of the slice the group is laid
    out on; ``wraparound``: per axis, whether it has its wraparound link.
    ``algorithm``: ``"ring"``, ``"bidirectional_ring"``, ``"torus"`` (multi-dimensional
    rings), ``"direct"`` (all_to_all), ``"point_to_point"`` or ``"none"`` (one chip).
    """

    op: str
    target: str
    nbytes: int
    group_size: int
    algorithm: str
    shape: tuple
    wraparound: tuple
    bytes_per_link: float
    hops: int
    latency_s: float
    bandwidth_s: float
    link_bandwidth: float

    @property
    def time_s(self) -> float:
        """Simulated seconds of the collective."""
        return self.latency_s + self.bandwidth_s

    @property
    def bus_bandwidth(self) -> float:
        """nccl-tests' bus bandwidth, bytes/s: ``nbytes / time_s`` times the op's factor
        (all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all ``(n-1)/n``;
        broadcast, reduce, send, recv 1). 0 when the time is 0."""
        if self.time_s <= 0:
            return 0.0
        return self.nbytes / self.time_s * _BUS_FACTOR[self.op](self.group_size)


@functools.lru_cache(maxsize=None)
def _info(name):
    return _target.target_info(name)  # data files do not change while the process runs


@functools.lru_cache(maxsize=None)
def _known(name):
    """``name`` once it is a valid target (listing the data files each time cost ~0.5 ms per collective)."""
    _target._check_name(name, include_placeholders=True)
    return name


def _ici(target):
    """(name, ICI numbers) of ``target`` (default: the active one); raises for Spyre."""
    name = _target.get_target() if target is None else target
    if not isinstance(name, str):
        _target._check_name(name, include_placeholders=True)  # raises its ValueError
    info = _info(_known(name))
    if info["kind"] != "tpu":
        raise NotImplementedError(
            f"target {name!r} has no interconnect model: no card-to-card link, bandwidth or topology is published "
            "for it (see its data file); collective costs exist for the TPU targets "
            f"{', '.join(n for n in _target.list_targets() if _target.target_info(n)['kind'] == 'tpu')}"
        )
    return name, info


def _canonical_op(op):
    if not isinstance(op, str) or (op not in OPS and op not in _ALIASES):
        raise ValueError(f"unknown collective {op!r}; valid ops: {', '.join(OPS)}")
    return _ALIASES.get(op, op)


def _check_int(value, what, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")


def _max_chips(info):
    return math.prod(info["ici_max_slice_shape"])


def _shape_for(n, info):
    """Most balanced shape with ``n`` chips within the largest slice, or None."""
    limits = sorted(info["ici_max_slice_shape"])
    dims = len(limits)
    best = None
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for factors in itertools.product(divisors, repeat=dims - 1):
        rest, ok = n, True
        for f in factors:
            if rest % f:
                ok = False
                break
            rest //= f
        if not ok:
            continue
        shape = tuple(sorted(factors + (rest,)))
        if any(s > lim for s, lim in zip(shape, limits)):
            continue
        key = (max(shape), -min(shape))
        if best is None or key < best[0]:
            best = (key, shape)
    return None if best is None else best[1]


def slice_shape(group_size: int, target: str | None = None) -> tuple:
    """The slice shape (chips per axis, ascending) a group of ``group_size`` chips is
    laid out on: the most balanced one that fits the chip's largest slice, e.g.
    ``(2, 4)`` for 8 chips of v5e, ``(2, 2, 2)`` of v4, ``(16, 16)`` for 256 of v5e;
    ``(group_size,)`` (a path) when no rectangular shape fits.

    Raises ValueError for ``group_size < 1`` or above the largest slice, TypeError for
    a non-int, ValueError for an unknown target, NotImplementedError for Spyre.
    """
    _check_int(group_size, "group_size", 1)
    name, _ = _ici(target)
    return _layout_of(group_size, name)[0]


@functools.lru_cache(maxsize=1024)
def _layout_of(n, name):
    """:func:`_layout` of target ``name`` (cached: a collective's cost is asked per call)."""
    return _layout(n, _info(name))


def _layout(n, info):
    if n > _max_chips(info):
        raise ValueError(
            f"group_size {n} exceeds the largest {info['name']} slice "
            f"({'x'.join(map(str, info['ici_max_slice_shape']))} = {_max_chips(info)} chips)"
        )
    shape = _shape_for(n, info)
    if shape is None:
        return (n,), (False,)
    rule, k = info["ici_wraparound"]["rule"], info["ici_wraparound"]["n"]
    if rule == "every_axis_multiple_of":
        wrap_all = all(a % k == 0 for a in shape)
        wrap = tuple(wrap_all for _ in shape)
    elif rule == "axis_equals":
        wrap = tuple(a == k for a in shape)
    else:
        raise ValueError(f"targets/{info['name']}.json: unknown ici_wraparound rule {rule!r}")
    return shape, wrap


def _axis_ring(a, wrap):
    """(rings sharing the data, hops per step) of a ring along one axis of ``a`` chips."""
    if a == 2:
        return 1, 1
    if wrap:
        return 2, 1
    return 1, 2  # folded onto a line: every link once per direction, neighbours two hops apart


def _flat_ring(shape, wrap):
    """(rings, hops per step) of one ring through every chip of the slice."""
    n = math.prod(shape)
    axes = [a for a in shape if a > 1]
    if n == 2:
        return 1, 1
    hamiltonian = (len(axes) == 1 and all(w for a, w in zip(shape, wrap) if a > 1)) or (
        len(axes) >= 2 and (all(w for a, w in zip(shape, wrap) if a > 1) or n % 2 == 0)
    )
    return (2, 1) if hamiltonian else (1, 2)


class _Plan:
    """Accumulates one candidate algorithm's terms."""

    def __init__(self, algorithm):
        self.algorithm, self.hops, self.bw_bytes, self.link_bytes = algorithm, 0, 0.0, 0.0


def _ring_scatter(a, rings, hops, data):
    """(hops, bytes per link direction) of a ring reduce-scatter (or all-gather) of ``data`` bytes."""
    return (a - 1) * hops, (a - 1) / a * data / rings


def _reduce_scatter_plans(shape, wrap, nbytes, alpha, bw):
    """Candidate plans of a reduce-scatter (all-gather: the same terms)."""
    n = math.prod(shape)
    plans = []
    rings, h = _flat_ring(shape, wrap)
    p = _Plan("bidirectional_ring" if rings == 2 else "ring")
    p.hops, p.bw_bytes = _ring_scatter(n, rings, h, nbytes)
    p.link_bytes = p.bw_bytes
    plans.append(p)
    axes = [(a, w) for a, w in zip(shape, wrap) if a > 1]
    if len(axes) >= 2:
        k = len(axes)
        p = _Plan("torus")
        link_bytes = [0.0] * k
        sizes = [nbytes / k] * k  # part j's current data
        for phase in range(k):
            worst = None
            for j in range(k):
                ax = (j + phase) % k
                a, w = axes[ax]
                rings, h = _axis_ring(a, w)
                hops, b = _ring_scatter(a, rings, h, sizes[j])
                link_bytes[ax] += b
                if worst is None or hops * alpha + b / bw > worst[0] * alpha + worst[1] / bw:
                    worst = (hops, b)
                sizes[j] /= a
            p.hops += worst[0]
            p.bw_bytes += worst[1]
        p.link_bytes = max(link_bytes)
        plans.append(p)
    return plans


def _broadcast_plans(shape, wrap, nbytes):
    n = math.prod(shape)
    plans = []

    def steps(a, rings):
        return math.ceil((a - 1) / 2) if rings == 2 else a - 1

    rings, h = _flat_ring(shape, wrap)
    p = _Plan("bidirectional_ring" if rings == 2 else "ring")
    p.hops, p.bw_bytes = steps(n, rings) * h, nbytes / rings
    p.link_bytes = p.bw_bytes
    plans.append(p)
    axes = [(a, w) for a, w in zip(shape, wrap) if a > 1]
    if len(axes) >= 2:
        p = _Plan("torus")
        for a, w in axes:
            r, hh = _axis_ring(a, w)
            p.hops += steps(a, r) * hh
            p.bw_bytes = max(p.bw_bytes, nbytes / r)
        p.link_bytes = p.bw_bytes
        plans.append(p)
    return plans


def _all_to_all_plan(shape, wrap, nbytes):
    p = _Plan("direct")
    for a, w in zip(shape, wrap):
        if a == 1:
            continue
        per_offset = nbytes / a  # bytes each chip moves to each axis offset (dimension-ordered routing)
        if w:
            load = per_offset * sum(min(d, a - d) for d in range(1, a)) / 2
            p.hops += a // 2
        else:
            load = per_offset * (a // 2) * ((a + 1) // 2)
            p.hops += a - 1
        p.bw_bytes = max(p.bw_bytes, load)
    p.link_bytes = p.bw_bytes
    return [p]


def collective_cost(op: str, nbytes: int, group_size: int, target: str | None = None) -> CollectiveCost:
    """The simulated cost of collective ``op`` over ``group_size`` chips of ``target``.

    ``op``: one of ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``,
    ``reduce``, ``all_to_all``, ``send``, ``recv``, ``barrier`` (c10d names such as
    ``allreduce``, ``all_gather_into_tensor``, ``all_to_all_single``, ``isend`` are
    accepted). ``nbytes``: the buffer of one rank, bytes (module docstring; ignored by
    ``barrier``). ``target``: a TPU target name (default: the active one). Returns a
    :class:`CollectiveCost` (the cheapest of the algorithms the module docstring lists).

    Raises ValueError for an unknown op (naming it), ``nbytes < 0``, ``group_size < 1``,
    ``group_size`` above the chip's largest slice, or an unknown target; TypeError for
    non-int sizes; NotImplementedError for a target without interconnect data (Spyre).
    """
    op = _canonical_op(op)
    _check_int(nbytes, "nbytes", 0)
    _check_int(group_size, "group_size", 1)
    name, info = _ici(target)
    shape, wrap = _layout_of(group_size, name)
    bw, alpha = float(info["ici_link_bandwidth"]), float(info["ici_hop_latency_s"])
    if op == "barrier":
        nbytes = 0
    n = group_size
    if n == 1:
        plan = _Plan("none")
    elif op in ("send", "recv"):
        plan = _Plan("point_to_point")
        plan.hops, plan.bw_bytes = 1, float(nbytes)
        plan.link_bytes = plan.bw_bytes
    elif op in ("reduce_scatter", "all_gather", "all_reduce", "barrier"):
        plans = _reduce_scatter_plans(shape, wrap, nbytes, alpha, bw)
        if op in ("all_reduce", "barrier"):  # reduce-scatter, then its mirror all-gather
            for p in plans:
                p.hops, p.bw_bytes, p.link_bytes = 2 * p.hops, 2 * p.bw_bytes, 2 * p.link_bytes
        plan = min(plans, key=lambda p: (p.hops * alpha + p.bw_bytes / bw, p.hops))
    elif op in ("broadcast", "reduce"):
        plan = min(_broadcast_plans(shape, wrap, nbytes), key=lambda p: (p.hops * alpha + p.bw_bytes / bw, p.hops))
    else:  # all_to_all
        plan = _all_to_all_plan(shape, wrap, nbytes)[0]
    return CollectiveCost(
        op=op,
        target=name,
        nbytes=nbytes,
        group_size=n,
        algorithm=plan.algorithm,
        shape=tuple(shape),
        wraparound=tuple(wrap),
        bytes_per_link=plan.link_bytes,
        hops=plan.hops,
        latency_s=plan.hops * alpha,
        bandwidth_s=plan.bw_bytes / bw,
        link_bandwidth=bw,
    )


def collective_time(op: str, nbytes: int, group_size: int, target: str | None = None) -> float:
    """Simulated seconds of collective ``op`` on ``nbytes`` bytes over ``group_size``
    chips of ``target`` (default: the active one): :func:`collective_cost` ``.time_s``.
    Raises as :func:`collective_cost`.
    """
    return collective_cost(op, nbytes, group_size, target).time_s


def record_collective(op: str, nbytes: int, group_size: int, device=None):
    """Charges collective ``op`` to the simulated clock of chip ``device`` (int,
    ``"tpu:i"``, torch.device; None: the current one), on its current stream.

    The chip's pending ops run first (flush reason ``"collective"``), so the
    collective follows the work recorded before it; then the stream's and the chip's
    simulated clocks advance by its :func:`collective_time` on the active target, as a
    flush advances them for its kernels: a ``torch.Event(enable_timing=True)`` pair
    around it measures its simulated time, work on another stream overlaps it, and
    inside :func:`torch_tpu_eager.profile` it is a record of ``kind`` ``"collective"``
    (its ``collective`` dict holds the cost's algorithm, shape, bytes per link, hops,
    latency and bandwidth terms). Under ``torch.profiler.profile(activities=[...,
    ProfilerActivity.PrivateUse1])`` it is a device event ``"ici::<op>"`` on the chip's
    and stream's track (Chrome trace pid = chip, tid = stream) lasting its simulated
    time, with args ``bytes``, ``algorithm``, ``group_size``, ``hops``, linked to the
    enclosing op (the c10d collective) or to a host range of the same name; on a side
    stream it overlaps the default stream's kernels. Counted in ``metrics()`` (``collectives``,
    ``collective_time_s``, included in ``sim_time_s``).

    Returns the :class:`CollectiveCost` charged, or None when the active target has no
    interconnect model (Spyre: nothing is charged). Raises as :func:`collective_cost`,
    and ValueError / torch.AcceleratorError for a bad ``device``.
    """
    from .device import _index  # device.py imports torch; keep this module light

    index = _index(device)
    try:
        cost = collective_cost(op, nbytes, group_size)
    except NotImplementedError:
        _canonical_op(op)
        _check_int(nbytes, "nbytes", 0)
        _check_int(group_size, "group_size", 1)
        return None
    import torch

    from . import _C

    # Under a torch.profiler session, a host range of the same name that the device
    # activity links to (under a c10d op it links to that op instead).
    scope = torch.profiler.record_function("ici::" + cost.op) if torch.autograd._profiler_enabled() else _NO_SCOPE
    with scope:
        _C._record_collective(
            index,
            cost.op,
            cost.target,
            cost.time_s,
            cost.algorithm,
            cost.group_size,
            cost.nbytes,
            list(cost.shape),
            cost.bytes_per_link,
            cost.hops,
            cost.latency_s,
            cost.bandwidth_s,
        )
    return cost
