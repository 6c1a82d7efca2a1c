"""The c10d backend ``"tpu_ccl"``: collectives on "tpu" tensors over gloo on host copies.

How it plugs into torch.distributed (docs/distributed.md):

* :func:`register` calls ``torch.distributed.Backend.register_backend("tpu_ccl", ...,
  extended_api=True, devices=["tpu"])``: the backend becomes the default of the "tpu"
  device, so ``init_process_group()`` (torch picks the current accelerator, "tpu"),
  ``init_process_group("tpu_ccl")`` and ``init_process_group("cpu:gloo,tpu:tpu_ccl")``
  use it. Its creator (:func:`_create_backend`) returns the **transport**: a gloo
  backend on its own prefix of the store (TCP on localhost), behind a
  collective-fingerprint check (:func:`_verify`). The process group stays torch's C++ ``ProcessGroup``,
  so DDP's reducer, functional collectives (DTensor, FSDP2) and the Python API all
  reach it the same way.
* The ``c10d::*`` collective ops are dispatcher ops with a kernel per dispatch key;
  torch's generic PrivateUse1 kernels hand the device tensors to the backend, which
  gloo would reject. :func:`register` installs this module's kernels for the
  ``PrivateUse1`` key (``torch.library``). Per collective they copy the inputs to
  host staging buffers (reused; flushing the chip's pending ops that produce them; never a
  zero-copy share: gloo writes host memory behind PyTorch's back), run the gloo
  collective, wait for it, and copy the results back in place into the "tpu" tensors
  (recorded into the chip's queue, so later compute orders after it). The returned
  ``Work`` is complete (:func:`_finish`); errors of the transport (a dead peer, a
  timeout) and mismatches between ranks are raised by the call. Receives finish in
  ``wait()`` instead (:func:`_finish_later`).
* **On the simulated timeline** each collective runs on the chip's interconnect
  stream (:func:`ici_stream`), after the work queued on the stream that issued it,
  and the issuing stream waits for it only where the program waits (``wait()``, the
  work's future, ``async_op=False``): compute recorded in between overlaps it, as
  compute overlaps an NCCL collective on its own CUDA stream.
* One torch patch: ``init_process_group()`` without a backend gets tpu_ccl as its
  default backend type (:func:`_patch_undefined_backend`).

Every collective is charged through :func:`_charge_collective`, the one place that
accounts collectives (metrics, and its simulated ICI time on the chip's clock and the
profiler's device track through ``torch_tpu_eager.ici.record_collective``).

Values are those gloo computes on the same CPU tensors, bit for bit: the backend does
no arithmetic of its own (ReduceOp.AVG is gloo's), but for ReduceOp.PREMUL_SUM, which
gloo lacks: NCCL's semantics (each input times the factor rounded to the data's scalar
type, then gloo's SUM; :func:`_premultiply`); the factor is read by the C++ op
``tpu_eager::_premul_sum_factor`` (csrc/distributed/premul_sum.cpp), since the boxed
ReduceOp shows only its kind to Python.
"""

import atexit
import contextlib
import datetime
import threading
import time
import warnings
import zlib

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]  # _create_work_from_future has no stub
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ProcessGroup,
    PythonCallbackWork,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _create_work_from_future,
)

BACKEND_NAME = "tpu_ccl"
"""Name of the backend, after NCCL/oneCCL/"spyreccl": a collective communication library for "tpu"."""

_DEVICE = torch.device("tpu")

# ---- accounting: the one function every collective goes through ----

_lock = threading.Lock()
_metrics: dict = {"collectives": 0, "collective_bytes": 0, "collective_time_s": 0.0, "per_op": {}}


# Ops whose ``nbytes`` below is one rank's share: the interconnect model (nccl-tests'
# convention) costs the full buffer, ``group_size`` shares. A gather to one root or a
# scatter from it moves what an all_gather moves through the root's ring link, so the
# model costs them as one (torch_tpu_eager.ici has no separate rule for them).
_PER_RANK_SHARE = {"all_gather": "all_gather", "gather": "all_gather", "scatter": "all_gather"}


def _charge_collective(op_name: str, nbytes: int, group_size: int, device: torch.device) -> float:
    """Accounts one collective on ``device`` and returns its simulated time in seconds.

    ``op_name`` is the collective ("all_reduce", "all_gather", "reduce_scatter",
    "broadcast", "reduce", "all_to_all", "barrier", "send", "recv", "gather",
    "scatter"); ``nbytes`` the bytes of this rank's payload (the input of an
    all_gather or gather / the output of a scatter / the full input of a
    reduce_scatter / the reduced tensor of an all_reduce); ``group_size`` the ranks
    in the group. Every collective of the backend calls this, and nothing else does.

    The collective is charged to the chip's simulated clock through
    :func:`torch_tpu_eager.ici.record_collective` (its time on the active target's
    interconnect; 0.0 on a target without one, such as Spyre), which also puts it
    on the profiler's device track and runs the chip's pending ops first.
    """
    from .. import ici

    model_op = _PER_RANK_SHARE.get(op_name, op_name)
    model_bytes = int(nbytes) * group_size if op_name in _PER_RANK_SHARE else int(nbytes)
    cost = ici.record_collective(model_op, model_bytes, group_size, device)
    t = 0.0 if cost is None else float(cost.time_s)
    with _lock:
        _metrics["collectives"] += 1
        _metrics["collective_bytes"] += int(nbytes)
        _metrics["collective_time_s"] += t
        per = _metrics["per_op"].setdefault(op_name, {"count": 0, "bytes": 0, "time_s": 0.0})
        per["count"] += 1
        per["bytes"] += int(nbytes)
        per["time_s"] += t
    return t


def collective_metrics() -> dict:
    """Counters of this process's collectives on "tpu" tensors since start or reset.

    ``collectives`` (count), ``collective_bytes`` (payload bytes, see
    :func:`_charge_collective`), ``collective_time_s`` (simulated interconnect
    seconds from torch_tpu_eager.ici; 0.0 on a target without an interconnect model), ``per_op``: op name ->
    ``{"count", "bytes", "time_s"}``.
    """
    with _lock:
        return {k: ({o: dict(v) for o, v in val.items()} if k == "per_op" else val) for k, val in _metrics.items()}


def reset_collective_metrics() -> None:
    """Zeroes :func:`collective_metrics`."""
    with _lock:
        _metrics.update(collectives=0, collective_bytes=0, collective_time_s=0.0, per_op={})


# ---- helpers of the kernels ----


def _check(tensors, written=False):
    """Every tensor must be a dense "tpu" tensor (as NCCL requires CUDA dense tensors).

    ``written``: the collective writes its result into these in place. One whose elements
    share memory (a stride 0 of an ``expand``) could not hold a result per element, so it
    raises NCCL's ValueError "Tensors must be contiguous" at the call, before any rank
    communicates (gloo on CPU returns whichever element its loop wrote last). Other
    strided tensors (a transposed view, a column slice) are written as gloo on CPU
    writes them."""
    for t in tensors:
        if t.device.type != "tpu" or t.layout != torch.strided:
            raise ValueError(f"Tensors must be tpu and dense, got a {t.layout} tensor on {t.device}")
        if written and torch._debug_has_internal_overlap(t) == 1:  # MemOverlap::Yes
            raise ValueError(
                "Tensors must be contiguous: the collective writes its result in place into a tensor of "
                f"sizes {list(t.shape)} and strides {list(t.stride())} whose elements share memory "
                "(an expanded tensor); pass a contiguous one (e.g. .contiguous() or .clone())"
            )


# Host staging buffers, reused across collectives: a fresh buffer of tens of MiB is
# mmap'ed and page-faulted on every call (glibc maps allocations above 32 MiB), which
# cost more than the copy itself. Buffers taken inside a collective (_on_lane) go back
# to the pool when it completed (the copy back into the chip has run by then); at most
# _POOL_MAX_BYTES stay pooled. Receives and sends allocate their own (they finish later).
_POOL_MAX_BYTES = 512 << 20
_pool: dict = {}  # (dtype, numel) -> free flat host tensors
_pool_bytes = [0]
_pool_lock = threading.Lock()
_staging = threading.local()  # .taken: the buffers of the collective running on this thread, or None


def _take(dtype, shape):
    numel = 1
    for d in shape:
        numel *= d
    taken = getattr(_staging, "taken", None)
    buf = None
    if taken is not None:
        with _pool_lock:
            free = _pool.get((dtype, numel))
            if free:
                buf = free.pop()
                _pool_bytes[0] -= buf.numel() * buf.element_size()
    if buf is None:
        buf = torch.empty(numel, dtype=dtype)
    if taken is not None:
        taken.append(buf)
    return buf.view(shape)


def _release(buffers):
    with _pool_lock:
        for b in buffers:
            nbytes = b.numel() * b.element_size()
            if _pool_bytes[0] + nbytes <= _POOL_MAX_BYTES:
                _pool.setdefault((b.dtype, b.numel()), []).append(b)
                _pool_bytes[0] += nbytes


def _to_host(t):
    """A contiguous host copy of ``t`` (flushes what produces it)."""
    h = _take(t.dtype, tuple(t.shape))
    h.copy_(t)
    return h


def _host_empty(t):
    return _take(t.dtype, tuple(t.shape))


def _unbox(process_group):
    pg = ProcessGroup.unbox(process_group)
    return pg, _Transport(pg._get_backend(_DEVICE), pg.group_name)


# ---- the transport: gloo behind a collective-fingerprint check ----
#
# Plain gloo *aborts the process* (an uncaught gloo::EnforceNotMet on its I/O thread) when
# ranks pass different sizes to a collective. Before each collective the ranks therefore
# all-gather a fixed-size fingerprint of it (op, sequence number, the dtypes and shapes of
# the tensors torch's _ProcessGroupWrapper compares for that op) and every rank raises
# torch's RuntimeError "Detected mismatch between collectives on ranks" on a difference,
# as torch does for gloo and NCCL under TORCH_DISTRIBUTED_DEBUG=DETAIL. One all-gather of
# 512 bytes: torch's wrapper needs a monitored barrier and two all-gathers (the
# fingerprint's length, then the fingerprint), each a rendezvous of every rank.

# The tensors each Backend method's fingerprint describes (its positional arguments ->
# tensors), as _ProcessGroupWrapper chooses them; none where sizes may differ by design
# (all_to_all's uneven splits, the coalesced forms). Point-to-point is not checked (gloo
# neither checks a message's size or dtype against the receive buffer, nor aborts there).
_FINGERPRINTED = {
    "broadcast": lambda a: a[0],
    "allreduce": lambda a: a[0],
    "allreduce_coalesced": lambda a: [],
    "reduce": lambda a: a[0],
    "allgather": lambda a: a[1],
    "_allgather_base": lambda a: [a[1]],
    "allgather_coalesced": lambda a: [],
    "gather": lambda a: a[1],
    "scatter": lambda a: a[0],
    "reduce_scatter": lambda a: a[0],
    "_reduce_scatter_base": lambda a: [a[1], a[0]],
    "alltoall": lambda a: [],
    "alltoall_base": lambda a: [],
    "barrier": lambda a: [],
}
_FP_OPS = tuple(_FINGERPRINTED)


def _split_numels(t, splits, world):
    """Elements of ``t`` per peer in an ``alltoall_base``: ``splits`` rows each (its rows split
    evenly when ``splits`` is empty)."""
    if not splits:
        return [t.numel() // world] * world
    if len(splits) != world:
        return None
    row = 1
    for d in t.shape[1:]:
        row *= d
    return [int(n) * row for n in splits]


# The all-to-alls legitimately differ in size between ranks, so their fingerprint describes
# no tensor; instead each rank adds its exchange -- (input dtype, output dtype, elements sent
# to each peer, elements expected from each peer) -- and every rank checks the whole matrix:
# what rank i sends to rank j must be what rank j expects from rank i. Plain gloo aborts the
# process when all_to_all's lists disagree and silently leaves garbage when all_to_all_single's
# splits do. Arguments -> (input dtype, output dtype, sent per peer, expected per peer).
# An exchange that is malformed on this rank alone (lists or splits not one per peer) is left
# to gloo's own error at the call (None).
_EXCHANGES = {
    "alltoall": lambda a, world: (
        (a[1][0].dtype, a[0][0].dtype, [t.numel() for t in a[1]], [t.numel() for t in a[0]])
        if len(a[0]) == len(a[1]) == world
        else None
    ),
    "alltoall_base": lambda a, world: (
        a[1].dtype,
        a[0].dtype,
        _split_numels(a[1], a[3], world),
        _split_numels(a[0], a[2], world),
    ),
}
_FP_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_FP_SLOTS = 64  # int64 slots: op, sequence number, payload length, payload checksum, payload
_fp_seq: dict = {}  # group name -> collectives checked in this process


# ---- interpreter exit: gloo's worker threads release our host tensors ----
#
# ProcessGroupGloo's worker thread (pt_gloo_runloop) drops its reference to a work -- and so
# to the host tensors the work holds -- after it completed the work, i.e. after ``wait()`` may
# have returned to us. Those tensors were made in Python, and releasing a C++ reference of a
# tensor that has a Python object takes the GIL (c10::TensorImpl::decref_pyobject). If the
# interpreter is finalizing by then (the last collective of a program is just before its
# exit), CPython ends that thread with pthread_exit, whose unwinding through a noexcept
# destructor aborts the process ("terminate called without an active exception", SIGABRT).
# So every tensor handed to gloo stays listed here until only Python holds it, and an atexit
# handler (:func:`_drain_transport`, run while Python is whole) waits for the workers to let
# go of the listed ones.
_handed: list = []
_handed_lock = threading.Lock()
_DRAIN_TIMEOUT_S = 5.0


def _tensors_in(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors_in(a)


def _held_by_gloo(t):
    return t._use_count() > 1  # 1: only its Python object's reference


def _hand_to_gloo(args):
    """Lists the tensors in ``args`` (about to be passed to a gloo call) until gloo lets go."""
    fresh = list(_tensors_in(args))
    if not fresh:
        return
    with _handed_lock:
        _handed[:] = [t for t in _handed if _held_by_gloo(t)] + fresh


def _drain_transport(timeout_s=_DRAIN_TIMEOUT_S):
    """atexit: waits (up to ``timeout_s`` seconds) until gloo's worker threads released every
    listed tensor, so none of them takes the GIL once the interpreter is finalizing. A work
    never waited for (an unmatched ``irecv``) can hold its tensors forever: then gives up."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _handed_lock:
            _handed[:] = [t for t in _handed if _held_by_gloo(t)]
            if not _handed:
                return
        if time.monotonic() > deadline:
            return
        time.sleep(0.001)


atexit.register(_drain_transport)


class _Transport:
    """The gloo backend of a tpu_ccl group; its collectives run after the fingerprint check.
    Every call's tensors are listed for :func:`_drain_transport`."""

    def __init__(self, gloo, group):
        self._gloo, self._group = gloo, group

    def __getattr__(self, name):
        method = getattr(self._gloo, name)
        pick = _FINGERPRINTED.get(name)

        def call(*args):
            if pick is not None:
                exchange = _EXCHANGES.get(name)
                world = self._gloo.size()
                _verify(self._gloo, self._group, name, list(pick(args)), exchange and exchange(args, world))
            _hand_to_gloo(args)
            return method(*args)

        return call if callable(method) else method


def _fingerprint(op, seq, tensors):
    payload = [len(tensors)] + [_FP_DTYPES.index(t.dtype) if t.dtype in _FP_DTYPES else 99 for t in tensors]
    for t in tensors:
        payload += [t.dim(), *t.shape]
    room = _FP_SLOTS - 4
    crc = zlib.crc32(repr(payload).encode())
    head = [_FP_OPS.index(op), seq, len(payload), crc]
    body = payload[:room] + [-1] * (room - min(room, len(payload)))
    return torch.tensor(head + body, dtype=torch.int64)


def _describe(fp):
    """torch's text of a fingerprint: CollectiveFingerPrint(SequenceNumber=..., OpType=..., ...)."""
    v = fp.tolist()
    op, seq, n_payload, body = _FP_OPS[v[0]].upper(), v[1], v[2], v[4:]
    if n_payload > len(body) or not body or body[0] <= 0:
        more = "" if n_payload <= len(body) else ", ..."
        return f"CollectiveFingerPrint(SequenceNumber={seq}, OpType={op}{more})"
    n = body[0]
    dtypes = [str(_FP_DTYPES[c]).replace("torch.", "") if c < len(_FP_DTYPES) else "?" for c in body[1 : 1 + n]]
    shapes, i = [], 1 + n
    for _ in range(n):
        dim = body[i]
        shapes.append(list(body[i + 1 : i + 1 + dim]))
        i += 1 + dim
    return f"CollectiveFingerPrint(SequenceNumber={seq}, OpType={op}, TensorShape={shapes}, TensorDtypes={dtypes})"


def _verify(gloo, group, op, tensors, exchange=None):
    """All-gathers this rank's fingerprint of collective ``op`` on ``tensors`` (host
    buffers) and raises RuntimeError "Detected mismatch between collectives on ranks. Rank
    i is running collective: ..., but Rank j is running collective: ..." on every rank when
    one differs. For an all-to-all, ``exchange`` (see ``_EXCHANGES``) travels with it, and
    every rank raises RuntimeError "Detected mismatch between collectives on ranks. Rank i
    sends n elements of dtype to rank j, but Rank j expects m elements of dtype from rank i"
    when the ranks' sizes or dtypes do not pair up. Errors of the all-gather itself (a dead
    peer, the group's timeout) are gloo's RuntimeError."""
    seq = _fp_seq[group] = _fp_seq.get(group, 0) + 1
    world = gloo.size()
    # the same length on every rank whatever the op (gloo aborts on all-gathers of different sizes)
    mine = torch.full((_FP_SLOTS + 2 + 2 * world,), -1, dtype=torch.int64)
    mine[:_FP_SLOTS] = _fingerprint(op, seq, tensors)
    if exchange is not None and (exchange[2] is None or exchange[3] is None):
        exchange = None
    if exchange is not None:
        dt_in, dt_out, sent, expected = exchange
        mine[_FP_SLOTS : _FP_SLOTS + 2] = torch.tensor([_dtype_code(dt_in), _dtype_code(dt_out)])
        mine[_FP_SLOTS + 2 :] = torch.tensor(list(sent) + list(expected), dtype=torch.int64)
    theirs = [torch.empty_like(mine) for _ in range(world)]
    _hand_to_gloo((theirs, mine))
    gloo.allgather([theirs], [mine]).wait()
    me = gloo.rank()
    for rank, other in enumerate(theirs):
        if not torch.equal(other[:_FP_SLOTS], mine[:_FP_SLOTS]):
            raise RuntimeError(
                f"Detected mismatch between collectives on ranks. Rank {me} is running collective: "
                f"{_describe(mine[:_FP_SLOTS])}, but Rank {rank} is running collective: "
                f"{_describe(other[:_FP_SLOTS])}."
            )
    if exchange is not None:
        rows = [t[_FP_SLOTS:].tolist() for t in theirs]
        for i, row_i in enumerate(rows):
            for j, row_j in enumerate(rows):
                sent, dt_sent = row_i[2 + j], row_i[0]
                expected, dt_expected = row_j[2 + world + i], row_j[1]
                if (sent, dt_sent) != (expected, dt_expected):
                    raise RuntimeError(
                        f"Detected mismatch between collectives on ranks. Rank {i} sends {sent} elements of "
                        f"{_dtype_name(dt_sent)} to rank {j} in {op.upper()}, but Rank {j} expects {expected} "
                        f"elements of {_dtype_name(dt_expected)} from rank {i}."
                    )


def _dtype_code(dtype):
    return _FP_DTYPES.index(dtype) if dtype in _FP_DTYPES else 99


def _dtype_name(code):
    return str(_FP_DTYPES[code]).replace("torch.", "") if 0 <= code < len(_FP_DTYPES) else "?"


# NCCL's PREMUL_SUM data types; the factor is read as this dtype (torch's NCCL
# backend passes a float factor for bfloat16 data, the data's own dtype otherwise).
_PREMUL_SCALAR_DTYPE = {
    torch.float16: torch.float16,
    torch.float32: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float64: torch.float64,
}


def _reduce_op(boxed):
    """(the ReduceOp gloo runs, the PREMUL_SUM factor or None) of a boxed c10d ReduceOp.

    PREMUL_SUM (``torch.distributed._make_nccl_premul_sum(factor)``, which gloo does
    not have) runs as NCCL defines it: every rank's input times the factor, then SUM;
    :func:`_premultiply` does the product, gloo the sum."""
    kind = ReduceOp.RedOpType(int(boxed.op()))
    if kind == ReduceOp.RedOpType.PREMUL_SUM:
        return ReduceOp(ReduceOp.RedOpType.SUM), torch.ops.tpu_eager._premul_sum_factor(boxed)
    return ReduceOp(kind), None


def _premultiply(host_tensors, premul):
    """Multiplies each host tensor in place by the PREMUL_SUM factor, as NCCL's
    ncclRedOpCreatePreMulSum does before the sum: the factor (a number, or a
    1-element tensor on "tpu" as NCCL wants it on the GPU) is rounded to the
    scalar dtype (float32 for bfloat16 data, the data's dtype otherwise) and each
    element becomes the rounded product. No-op when ``premul`` is None.

    Raises NCCL's errors: TypeError "PreMulSum Data type must be half, float,
    bfloat16 or double" for other dtypes; RuntimeError "expected scalar type X but
    found Y" for a factor tensor of another dtype; ValueError for a factor tensor
    that is not one element on "tpu"."""
    if premul is None:
        return host_tensors
    number, tensor = premul
    for h in host_tensors:
        scalar_dtype = _PREMUL_SCALAR_DTYPE.get(h.dtype)
        if scalar_dtype is None:
            raise TypeError("PreMulSum Data type must be half, float, bfloat16 or double")
        if tensor is not None:
            if tensor.device.type != "tpu" or tensor.numel() != 1:
                raise ValueError(
                    f"ReduceOp.PREMUL_SUM: the factor tensor must have 1 element on tpu (NCCL reads it on the "
                    f"device), got {tensor.numel()} on {tensor.device}"
                )
            if tensor.dtype != scalar_dtype:
                found = _SCALAR_NAME.get(tensor.dtype, str(tensor.dtype))
                raise RuntimeError(f"expected scalar type {_SCALAR_NAME[scalar_dtype]} but found {found}")
            factor = float(tensor.reshape(()).item())
        else:
            factor = float(torch.tensor(number, dtype=scalar_dtype).item())  # rounded to the scalar dtype
        h.mul_(factor)  # CPU: float(x) * factor in the op's math type, rounded once to h's dtype
    return host_tensors


_SCALAR_NAME = {
    torch.float16: "Half",
    torch.float32: "Float",
    torch.bfloat16: "BFloat16",
    torch.float64: "Double",
    torch.int64: "Long",
    torch.int32: "Int",
}


def _timeout(opts, timeout):
    if timeout is not None and timeout >= 0:
        opts.timeout = datetime.timedelta(milliseconds=timeout)
    return opts


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


class _Done:
    """A finished transport step (the coalesced collectives wait for each part themselves)."""

    def wait(self):
        return True


# ---- the chip's timeline: collectives on the chip's interconnect stream ----

_lanes: dict = {}
_lanes_lock = threading.Lock()


def ici_stream(device=None):
    """The stream of chip ``device`` (index, "tpu:i", torch.device; None: the current
    one) on which this process's collectives run: the chip's interconnect lane, as
    NCCL runs a CUDA device's collectives on a stream of its own.

    Each collective is ordered after the work queued so far on the stream that issued
    it, occupies this stream for its simulated ICI time, and is joined back only where
    the program waits for it: ``work.wait()``, ``work.get_future().wait()`` (DDP waits
    on its buckets' futures at the end of backward), the synchronous form of a
    collective (``async_op=False`` waits at the call) or a ``wait_stream`` on this
    stream. Compute recorded in between that does not wait overlaps the collective on
    the simulated timeline (the kernels' stream and this one each keep a clock).

    Returns a ``torch.tpu.Stream``, the same one for every call on that chip in this
    process. Raises ValueError for a non-"tpu" device and torch.AcceleratorError for an
    invalid chip index, as ``torch.tpu.Stream`` does.
    """
    from ..device import _index

    index = _index(device)
    with _lanes_lock:
        lane = _lanes.get(index)
        if lane is None:
            lane = _lanes[index] = torch.tpu.Stream(index)
        return lane


@contextlib.contextmanager
def _on_lane(device, staged=True):
    """Runs the body (host copies, the transport, the charge, the copy back) on the
    chip's interconnect stream, after the work queued on the issuing stream. With
    ``staged``, the host buffers the body takes (:func:`_to_host`, :func:`_host_empty`)
    return to the pool when it completes without an error (the body then has waited
    for the transport and copied the results back, :func:`_finish`)."""
    issuing = torch.tpu.current_stream(device)
    lane = ici_stream(device)
    outer = getattr(_staging, "taken", None)
    _staging.taken = [] if staged else None
    try:
        if issuing.stream_id == lane.stream_id:  # already on the lane (a collective issued there)
            yield lane
        else:
            lane.wait_stream(issuing)  # runs the chip's pending ops: the inputs exist
            with torch.tpu.stream(lane):
                yield lane
        if staged:
            _release(_staging.taken)
    finally:
        _staging.taken = outer


def _copy_back(pairs):
    # Below autograd and ADInplaceOrView, as a C++ backend writes its output: the collective
    # must not move the tensors' version counters (gloo on CPU and NCCL do not), else a view
    # taken earlier of the same base, e.g. a chunk of a leaf that distribute_tensor then
    # broadcasts into, raises "... its base ... has been modified inplace" when next read.
    with torch.no_grad(), torch._C._AutoDispatchBelowADInplaceOrView():
        for dev, host in pairs:
            dev.copy_(host)  # recorded into the chip's queue, ordered with later compute


def _finish(work, pairs, result, device):
    """Waits for the gloo ``work`` (raising its error: a dead peer, a timeout), copies the
    results back into the "tpu" tensors and returns a completed, boxed Work whose future
    holds ``result``. Called on the chip's interconnect stream (:func:`_on_lane`).

    The collective completes at the call, also with ``async_op=True``: DDP's reducer
    waits on ``work.get_future()`` without calling ``wait()``, and a Work built from a
    Python future in torch 2.13 (``_create_work_from_future``) swallows the future's
    error in ``wait()``; a completed Work has neither problem. The future is one of
    ``device`` (``torch.futures.Future(devices=...)``), so completing it records an event
    on the interconnect stream at the collective's simulated end, and waiting on it
    (``Work.wait()``, ``Future.wait()``, DDP's reducer) makes the waiting stream's later
    work start after that end, as a CUDA future of an NCCL collective does.
    """
    work.wait()
    _copy_back(pairs)
    fut = torch.futures.Future(devices=[device])
    fut.set_result(result)
    return _create_work_from_future(fut).boxed()


def _finish_later(work, pairs, device):
    """A boxed Work for a point-to-point transfer: ``wait()`` waits for gloo's ``work``
    (raising its error), copies a received message into the "tpu" tensors on the chip's
    interconnect stream and makes the waiting stream's later work start after it. Not
    completed at the call, so that ``irecv`` before the matching ``send`` does not
    deadlock. Otherwise it answers as gloo's Work (the C++ op ``tpu_eager::_p2p_work``,
    csrc/distributed/p2p_work.cpp): ``_source_rank()`` is the sender of a receive from any
    source, ``get_future()`` raises gloo's RuntimeError "Work::getFuture not implemented.",
    ``is_completed()`` as gloo's (True after ``wait()``; the message is then in the chip's
    tensors)."""
    done = []

    def wait(timeout):
        if not done:
            work.wait()
            lane = ici_stream(device)
            with torch.tpu.stream(lane):
                _copy_back(pairs)
                end = lane.record_event()
            torch.tpu.current_stream(device).wait_event(end)
            done.append(True)
        return True

    return torch.ops.tpu_eager._p2p_work(work.boxed(), PythonCallbackWork(wait).boxed())


# ---- kernels of the c10d ops for the PrivateUse1 ("tpu") dispatch key ----
#
# Each one: checks its tensors, then on the chip's interconnect stream (_on_lane) copies
# the inputs to host buffers, charges the collective (_charge_collective), runs gloo on
# the host buffers and copies the results back (_finish).


def _allreduce(tensors, process_group, reduce_op, sparse_indices=None, async_op=True, timeout=-1):
    _check(tensors, written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(AllreduceOptions(), timeout)
    opts.reduceOp, premul = _reduce_op(reduce_op)
    dev = tensors[0].device
    with _on_lane(dev):
        host = _premultiply([_to_host(t) for t in tensors], premul)
        _charge_collective("all_reduce", _nbytes(tensors), pg.size(), dev)
        w = be.allreduce(host, opts)
        return tensors, _finish(w, list(zip(tensors, host)), tensors, dev)


def _allreduce_coalesced(tensors, process_group, reduce_op, async_op=True, timeout=-1):
    _check(tensors, written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(AllreduceCoalescedOptions(), timeout)
    opts.reduceOp, premul = _reduce_op(reduce_op)
    dev = tensors[0].device
    with _on_lane(dev):
        host = _premultiply([_to_host(t) for t in tensors], premul)
        _charge_collective("all_reduce", _nbytes(tensors), pg.size(), dev)
        return _finish(be.allreduce_coalesced(host, opts), list(zip(tensors, host)), tensors, dev)


def _broadcast(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    _check(tensors, written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(BroadcastOptions(), timeout)
    opts.rootRank, opts.rootTensor = root_rank, root_tensor
    dev = tensors[0].device
    with _on_lane(dev):
        host = [_to_host(t) for t in tensors]
        _charge_collective("broadcast", _nbytes(tensors), pg.size(), dev)
        w = be.broadcast(host, opts)
        return tensors, _finish(w, list(zip(tensors, host)), tensors, dev)


def _reduce(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    _check(tensors, written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(ReduceOptions(), timeout)
    opts.reduceOp, premul = _reduce_op(reduce_op)
    opts.rootRank, opts.rootTensor = root_rank, root_tensor
    dev = tensors[0].device
    with _on_lane(dev):
        host = _premultiply([_to_host(t) for t in tensors], premul)
        _charge_collective("reduce", _nbytes(tensors), pg.size(), dev)
        # gloo uses the other ranks' buffers as scratch: copy back everywhere, as gloo leaves them.
        return _finish(be.reduce(host, opts), list(zip(tensors, host)), tensors, dev)


def _allgather(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    _check(input_tensors)
    for outs in output_tensors:
        _check(outs, written=True)
    pg, be = _unbox(process_group)
    dev = input_tensors[0].device
    with _on_lane(dev):
        host_in = [_to_host(t) for t in input_tensors]
        host_out = [[_host_empty(t) for t in outs] for outs in output_tensors]
        _charge_collective("all_gather", _nbytes(input_tensors), pg.size(), dev)
        w = be.allgather(host_out, host_in, _timeout(AllgatherOptions(), timeout))
        pairs = [p for outs, houts in zip(output_tensors, host_out) for p in zip(outs, houts)]
        return output_tensors, _finish(w, pairs, output_tensors, dev)


def _allgather_coalesced(output_lists, input_list, process_group, async_op=True):
    _check(input_list)
    for outs in output_lists:
        _check(outs, written=True)
    pg, be = _unbox(process_group)
    dev = input_list[0].device
    with _on_lane(dev):
        host_in = [_to_host(t) for t in input_list]
        host_out = [[_host_empty(t) for t in outs] for outs in output_lists]
        _charge_collective("all_gather", _nbytes(input_list), pg.size(), dev)
        w = be.allgather_coalesced(host_out, host_in, AllgatherOptions())
        pairs = [p for outs, houts in zip(output_lists, host_out) for p in zip(outs, houts)]
        return _finish(w, pairs, output_lists, dev)


def _allgather_base(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):
    _check([input_tensor])
    _check([output_tensor], written=True)
    pg, be = _unbox(process_group)
    dev = input_tensor.device
    with _on_lane(dev):
        h_in, h_out = _to_host(input_tensor), _host_empty(output_tensor)
        _charge_collective("all_gather", _nbytes([input_tensor]), pg.size(), dev)
        w = be._allgather_base(h_out, h_in, _timeout(AllgatherOptions(), timeout))
        return output_tensor, _finish(w, [(output_tensor, h_out)], output_tensor, dev)


def _allgather_into_tensor_coalesced(outputs, inputs, process_group, async_op=True):
    _check(inputs)
    _check(outputs, written=True)
    pg, be = _unbox(process_group)
    dev = inputs[0].device
    with _on_lane(dev):
        h_in = [_to_host(t) for t in inputs]
        h_out = [_host_empty(t) for t in outputs]
        _charge_collective("all_gather", _nbytes(inputs), pg.size(), dev)
        # the Python binding of a c10d Backend has no coalesced all-gather: one per tensor
        for o, i in zip(h_out, h_in):
            be._allgather_base(o, i, AllgatherOptions()).wait()
        return _finish(_Done(), list(zip(outputs, h_out)), outputs, dev)


def _reduce_scatter(output_tensors, input_tensors, process_group, reduce_op, async_op=True, timeout=-1):
    _check(output_tensors, written=True)
    for ins in input_tensors:
        _check(ins)
    pg, be = _unbox(process_group)
    opts = _timeout(ReduceScatterOptions(), timeout)
    opts.reduceOp, premul = _reduce_op(reduce_op)
    dev = output_tensors[0].device
    with _on_lane(dev):
        h_out = [_host_empty(t) for t in output_tensors]
        h_in = [_premultiply([_to_host(t) for t in ins], premul) for ins in input_tensors]
        _charge_collective("reduce_scatter", sum(_nbytes(ins) for ins in input_tensors), pg.size(), dev)
        w = be.reduce_scatter(h_out, h_in, opts)
        return output_tensors, _finish(w, list(zip(output_tensors, h_out)), output_tensors, dev)


def _reduce_scatter_base(output_tensor, input_tensor, process_group, reduce_op, async_op=True, timeout=-1):
    _check([input_tensor])
    _check([output_tensor], written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(ReduceScatterOptions(), timeout)
    opts.reduceOp, premul = _reduce_op(reduce_op)
    dev = input_tensor.device
    with _on_lane(dev):
        h_in, h_out = _premultiply([_to_host(input_tensor)], premul)[0], _host_empty(output_tensor)
        _charge_collective("reduce_scatter", _nbytes([input_tensor]), pg.size(), dev)
        w = be._reduce_scatter_base(h_out, h_in, opts)
        return output_tensor, _finish(w, [(output_tensor, h_out)], output_tensor, dev)


def _reduce_scatter_tensor_coalesced(outputs, inputs, process_group, reduce_op, async_op=True, timeout=-1):
    _check(inputs)
    _check(outputs, written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(ReduceScatterOptions(), timeout)
    opts.reduceOp, premul = _reduce_op(reduce_op)
    dev = inputs[0].device
    with _on_lane(dev):
        h_in = _premultiply([_to_host(t) for t in inputs], premul)
        h_out = [_host_empty(t) for t in outputs]
        _charge_collective("reduce_scatter", _nbytes(inputs), pg.size(), dev)
        for o, i in zip(h_out, h_in):  # no coalesced reduce-scatter in the binding: one per tensor
            be._reduce_scatter_base(o, i, opts).wait()
        return _finish(_Done(), list(zip(outputs, h_out)), outputs, dev)


def _alltoall(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    _check(input_tensors)
    _check(output_tensors, written=True)
    pg, be = _unbox(process_group)
    dev = input_tensors[0].device
    with _on_lane(dev):
        h_in = [_to_host(t) for t in input_tensors]
        h_out = [_host_empty(t) for t in output_tensors]
        _charge_collective("all_to_all", _nbytes(input_tensors), pg.size(), dev)
        w = be.alltoall(h_out, h_in, _timeout(AllToAllOptions(), timeout))
        return output_tensors, _finish(w, list(zip(output_tensors, h_out)), output_tensors, dev)


def _alltoall_base(output, input, process_group, output_split_sizes, input_split_sizes, async_op=True, timeout=-1):
    _check([input])
    _check([output], written=True)
    pg, be = _unbox(process_group)
    dev = input.device
    with _on_lane(dev):
        h_in, h_out = _to_host(input), _host_empty(output)
        _charge_collective("all_to_all", _nbytes([input]), pg.size(), dev)
        w = be.alltoall_base(
            h_out, h_in, list(output_split_sizes), list(input_split_sizes), _timeout(AllToAllOptions(), timeout)
        )
        return _finish(w, [(output, h_out)], [output], dev)


def _barrier(tensor, process_group, device_ids, async_op=True, timeout=-1):
    pg, be = _unbox(process_group)
    dev = tensor.device
    with _on_lane(dev):
        _charge_collective("barrier", 0, pg.size(), dev)
        # its future holds the op's tensor (one of the chip), so waiting on it joins the lane
        return _finish(be.barrier(_timeout(BarrierOptions(), timeout)), [], [tensor], dev)


def _send(tensors, process_group, dst, tag):
    _check(tensors)
    pg, be = _unbox(process_group)
    dev = tensors[0].device
    with _on_lane(dev, staged=False):
        host = [_to_host(t) for t in tensors]
        _charge_collective("send", _nbytes(tensors), 2, dev)
        return _finish_later(be.send(host, dst, tag), [], dev)  # gloo's work keeps the host buffers alive


def _recv(tensors, process_group, src, tag):
    _check(tensors, written=True)
    pg, be = _unbox(process_group)
    dev = tensors[0].device
    with _on_lane(dev, staged=False):
        host = [_host_empty(t) for t in tensors]
        _charge_collective("recv", _nbytes(tensors), 2, dev)
    return _finish_later(be.recv(host, src, tag), list(zip(tensors, host)), dev)


def _recv_any_source(tensors, process_group, tag):
    _check(tensors, written=True)
    pg, be = _unbox(process_group)
    dev = tensors[0].device
    with _on_lane(dev, staged=False):
        host = [_host_empty(t) for t in tensors]
        _charge_collective("recv", _nbytes(tensors), 2, dev)
    return _finish_later(be.recv_anysource(host, tag), list(zip(tensors, host)), dev)


def _gather(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    _check(input_tensors)
    for outs in output_tensors:
        _check(outs, written=True)
    pg, be = _unbox(process_group)
    opts = _timeout(GatherOptions(), timeout)
    opts.rootRank = root_rank
    dev = input_tensors[0].device
    with _on_lane(dev):
        h_in = [_to_host(t) for t in input_tensors]
        h_out = [[_host_empty(t) for t in outs] for outs in output_tensors]
        _charge_collective("gather", _nbytes(input_tensors), pg.size(), dev)
        w = be.gather(h_out, h_in, opts)
        pairs = [p for outs, houts in zip(output_tensors, h_out) for p in zip(outs, houts)]
        return _finish(w, pairs, output_tensors, dev)


def _scatter(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    _check(output_tensors, written=True)
    for ins in input_tensors:
        _check(ins)
    pg, be = _unbox(process_group)
    opts = _timeout(ScatterOptions(), timeout)
    opts.rootRank = root_rank
    dev = output_tensors[0].device
    with _on_lane(dev):
        h_out = [_host_empty(t) for t in output_tensors]
        h_in = [[_to_host(t) for t in ins] for ins in input_tensors]
        _charge_collective("scatter", _nbytes(output_tensors), pg.size(), dev)
        w = be.scatter(h_out, h_in, opts)
        return output_tensors, _finish(w, list(zip(output_tensors, h_out)), output_tensors, dev)


_KERNELS = {
    "allreduce_": _allreduce,
    "allreduce_coalesced_": _allreduce_coalesced,
    "broadcast_": _broadcast,
    "reduce_": _reduce,
    "allgather_": _allgather,
    "allgather_coalesced_": _allgather_coalesced,
    "_allgather_base_": _allgather_base,
    "allgather_into_tensor_coalesced_": _allgather_into_tensor_coalesced,
    "reduce_scatter_": _reduce_scatter,
    "_reduce_scatter_base_": _reduce_scatter_base,
    "reduce_scatter_tensor_coalesced_": _reduce_scatter_tensor_coalesced,
    "alltoall_": _alltoall,
    "alltoall_base_": _alltoall_base,
    "barrier": _barrier,
    "send": _send,
    "recv_": _recv,
    "recv_any_source_": _recv_any_source,
    "gather_": _gather,
    "scatter_": _scatter,
}


def _create_backend(opts, backend_options):
    """Creator of the "tpu_ccl" backend (extended API): the transport, a gloo backend on
    its own prefix of the group's store (TCP on localhost). The kernels of this module
    run each collective on it after a fingerprint check across the ranks
    (:class:`_Transport`, :func:`_verify`)."""
    _fp_seq[opts.group_id] = 0  # the group's name (ProcessGroup.group_name): a new group counts from 0
    return dist.ProcessGroupGloo(
        dist.PrefixStore(f"{BACKEND_NAME}/", opts.store), opts.group_rank, opts.group_size, opts.timeout
    )


_lib = None


def register() -> None:
    """Registers the backend and the "tpu" kernels of the c10d ops (once; at ``import torch_tpu_eager``)."""
    global _lib
    if _lib is not None or not dist.is_available():
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["tpu"])
    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        # torch registers generic PrivateUse1 kernels (they pass device tensors to the
        # backend); replacing them is what a device does here, not an accident.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
        for name, fn in _KERNELS.items():
            lib.impl(name, fn, "PrivateUse1")
    _lib = lib
    _patch_undefined_backend()


def _patch_undefined_backend():
    """``init_process_group()`` without a backend on "tpu": as ``init_process_group("tpu_ccl")``
    (see the entry in torch_tpu_eager._torch_patches.PATCHES)."""
    from .. import _torch_patches
    from torch.distributed import distributed_c10d as c10d

    original = c10d._new_process_group_helper

    def _new_process_group_helper(
        group_size,
        group_rank,
        global_ranks_in_group,
        backend,
        store,
        group_name,
        backend_options=None,
        timeout=None,
        pg_tag=None,
        device_id=None,
        group_desc=None,
    ):
        if str(backend) == dist.Backend.UNDEFINED:
            picked = c10d.BackendConfig(backend).get_device_backend_map()
            if set(picked.values()) == {BACKEND_NAME}:
                backend = dist.Backend(BACKEND_NAME)
        return original(
            group_size,
            group_rank,
            global_ranks_in_group,
            backend,
            store,
            group_name,
            backend_options=backend_options,
            timeout=timeout,
            pg_tag=pg_tag,
            device_id=device_id,
            group_desc=group_desc,
        )

    _torch_patches.patch(
        c10d,
        "_new_process_group_helper",
        _new_process_group_helper,
        why="init_process_group() picks tpu_ccl as the group's default backend",
    )
