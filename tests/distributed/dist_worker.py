"""Multi-process programs for tests/distributed/test_distributed.py.

Run as ``python tests/distributed/dist_worker.py CASE [WORLD]`` (``torch_spawn:CASE``: the
processes started by ``torch.multiprocessing`` instead of ``multiprocessing``).

Starts WORLD (default 2) processes with the "spawn" method on localhost, each
rank on chip ``tpu:<rank % device_count>``, runs the case in every rank and exits
0 when every rank passed. Each case checks its results against CPU PyTorch (gloo
on CPU tensors, or a single-process CPU run) inside the ranks. Rank 0 prints
``CASE OK`` at the end. Grouping many checks per case keeps the process start-up
(~3-5 s of imports) rare.
"""

import datetime
import os
import socket
import sys
import tempfile
import time
import traceback

if __name__ != "__main__":  # the ranks (spawned: "__mp_main__") or an importer; the parent needs no torch
    import torch
    import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=30)


_inits = [0]


def _init(rank, world, backend=None, timeout=TIMEOUT):
    """init_process_group on a fresh FileStore: the n-th init of each rank meets the n-th of the
    others (a TCPStore on one port would still hold the keys of a destroyed group)."""
    _inits[0] += 1
    path = os.path.join(os.environ["TPU_DIST_TMP"], f"store{_inits[0]}")
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world, timeout=timeout)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bits(t):
    """A view of ``t`` whose equality is bit equality (floats by their integer pattern)."""
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])
    return t


def assert_bits(a, b, what=""):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(_bits(a), _bits(b)), (what, a, b)


def _inputs(rank, dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(100 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-20 if dtype != torch.uint8 else 0, 20, shape, generator=g).to(dtype)


# ---------------------------------------------------------------- cases


def case_collectives(rank, world):
    """Every collective and dtype on "tpu" tensors equals gloo on the same CPU tensors, bit for bit."""
    _init(rank, world, "cpu:gloo,tpu:tpu_ccl")
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    R = dist.ReduceOp
    _t0 = time.monotonic()
    # In-place collectives move the version counter as gloo's on CPU tensors do (not at all):
    # DTensor's distribute_tensor broadcasts into an alias of a leaf whose earlier views stay in use.
    for name, fn in (("all_reduce", dist.all_reduce), ("broadcast", lambda t: dist.broadcast(t, 0))):
        c, t = torch.ones(4), torch.ones(4, device=dev)
        vc, vt = c._version, t._version
        fn(c)
        fn(t)
        assert t._version - vt == c._version - vc, (name, t._version - vt, c._version - vc)
    for dtype in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.uint8,
        torch.int8,
        torch.bool,
    ):
        x = _inputs(rank, dtype)
        floating = dtype.is_floating_point
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX] if dtype != torch.bool else [R.MIN, R.MAX]
        if floating:
            ops.append(R.AVG)
        else:
            ops += [R.BAND, R.BOR, R.BXOR]
        if dtype == torch.bool:
            ops = [R.BAND, R.BOR, R.MAX, R.MIN]
        for op in ops:
            c = x.clone()
            dist.all_reduce(c, op=op)
            # a pending (unflushed) input on the device, through a non-contiguous view
            t = x.to(dev).t().clone().t()
            t = t + 0 if dtype != torch.bool else t
            dist.all_reduce(t, op=op)
            assert t.device == dev
            assert_bits(t, c, f"all_reduce {op} {dtype}")
        if dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            _check_premul_sum(rank, world, dev, x, dtype)
        # broadcast from each root
        for root in range(world):
            c = x.clone()
            dist.broadcast(c, src=root)
            t = x.to(dev)
            dist.broadcast(t, src=root)
            assert_bits(t, c, f"broadcast {dtype}")
        if dtype != torch.bool:
            c = x.clone()
            dist.reduce(c, dst=world - 1, op=R.SUM)
            t = x.to(dev)
            dist.reduce(t, dst=world - 1, op=R.SUM)
            assert_bits(t, c, f"reduce {dtype}")
        # all_gather (list) and all_gather_into_tensor
        cl = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(cl, x)
        tl = [torch.empty_like(x, device=dev) for _ in range(world)]
        dist.all_gather(tl, x.to(dev))
        for a, b in zip(tl, cl):
            assert_bits(a, b, f"all_gather {dtype}")
        c = torch.empty((world * 3, 5), dtype=dtype)
        dist.all_gather_into_tensor(c, x)
        t = torch.empty((world * 3, 5), dtype=dtype, device=dev)
        dist.all_gather_into_tensor(t, x.to(dev))
        assert_bits(t, c, f"all_gather_into_tensor {dtype}")
        # reduce_scatter (list) and reduce_scatter_tensor
        if dtype != torch.bool:
            ins = [_inputs(rank * 7 + j, dtype) for j in range(world)]
            c = torch.empty_like(x)
            dist.reduce_scatter(c, [i.clone() for i in ins])
            t = torch.empty_like(x, device=dev)
            dist.reduce_scatter(t, [i.to(dev) for i in ins])
            assert_bits(t, c, f"reduce_scatter {dtype}")
            big = _inputs(rank + 50, dtype, (world * 3, 5))
            c = torch.empty_like(x)
            dist.reduce_scatter_tensor(c, big)
            t = torch.empty_like(x, device=dev)
            dist.reduce_scatter_tensor(t, big.to(dev))
            assert_bits(t, c, f"reduce_scatter_tensor {dtype}")
        # all_to_all_single with uneven splits, all_to_all (lists)
        n_in = [1 + ((rank + j) % 3) for j in range(world)]
        n_out = [1 + ((j + rank) % 3) for j in range(world)]
        src = _inputs(rank + 9, dtype, (sum(n_in), 4))
        c = torch.empty((sum(n_out), 4), dtype=dtype)
        dist.all_to_all_single(c, src, n_out, n_in)
        t = torch.empty((sum(n_out), 4), dtype=dtype, device=dev)
        dist.all_to_all_single(t, src.to(dev), n_out, n_in)
        assert_bits(t, c, f"all_to_all_single {dtype}")
        ins = [_inputs(rank * 3 + j, dtype, (2, 3)) for j in range(world)]
        cl = [torch.empty((2, 3), dtype=dtype) for _ in range(world)]
        dist.all_to_all(cl, [i.clone() for i in ins])
        tl = [torch.empty((2, 3), dtype=dtype, device=dev) for _ in range(world)]
        dist.all_to_all(tl, [i.to(dev) for i in ins])
        for a, b in zip(tl, cl):
            assert_bits(a, b, f"all_to_all {dtype}")
        # gather / scatter to and from the last rank
        root = world - 1
        cl = [torch.empty_like(x) for _ in range(world)] if rank == root else None
        dist.gather(x, cl, dst=root)
        tl = [torch.empty_like(x, device=dev) for _ in range(world)] if rank == root else None
        dist.gather(x.to(dev), tl, dst=root)
        if rank == root:
            for a, b in zip(tl, cl):
                assert_bits(a, b, f"gather {dtype}")
        parts = [_inputs(40 + j, dtype) for j in range(world)]
        c = torch.empty_like(x)
        dist.scatter(c, parts if rank == root else None, src=root)
        t = torch.empty_like(x, device=dev)
        dist.scatter(t, [p.to(dev) for p in parts] if rank == root else None, src=root)
        assert_bits(t, c, f"scatter {dtype}")
        # point to point: send/recv and isend/irecv, both directions
        peer = (rank + 1) % world
        prev = (rank - 1) % world
        if world == 2:
            if rank == 0:
                dist.send(x.to(dev) * 1 if dtype != torch.bool else x.to(dev), dst=1)
                got = torch.empty_like(x, device=dev)
                dist.recv(got, src=1)
            else:
                got = torch.empty_like(x, device=dev)
                dist.recv(got, src=0)
                dist.send(x.to(dev), dst=0)
            assert_bits(got, _inputs(1 - rank, dtype), f"send/recv {dtype}")
        recv_buf = torch.empty_like(x, device=dev)
        reqs = [dist.irecv(recv_buf, src=prev), dist.isend(x.to(dev), dst=peer)]
        for r in reqs:
            r.wait()
        assert_bits(recv_buf, _inputs(prev, dtype), f"isend/irecv {dtype}")
        if os.environ.get("TPU_DIST_VERBOSE"):
            print(rank, dtype, f"{time.monotonic() - _t0:.1f}s", flush=True)
    # async handles: wait() and futures, several in flight
    xs = [torch.full((4,), float(rank + i), device=dev) for i in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    fut = works[1].get_future()
    for w in works:
        assert w.wait()
    res = fut.wait()
    assert isinstance(res, list) and res[0].device == dev, res
    for i, x in enumerate(xs):
        assert x.cpu().tolist() == [float(sum(r + i for r in range(world)))] * 4
    w = dist.all_gather_into_tensor(torch.empty(4 * world, device=dev), xs[0], async_op=True)
    w.get_future().wait()
    # coalesced (DDP/FSDP use these) and batch_isend_irecv
    ts = [torch.full((3,), 1.0 + rank, device=dev), torch.full((2, 2), 2.0 * rank, device=dev)]
    dist.all_reduce_coalesced(ts)
    assert ts[0].cpu().tolist() == [float(sum(1.0 + r for r in range(world)))] * 3
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(rank), device=dev), (rank + 1) % world),
        dist.P2POp(dist.irecv, torch.empty(2, device=dev), (rank - 1) % world),
    ]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    assert ops[1].tensor.cpu().tolist() == [float((rank - 1) % world)] * 2
    # a receive from any source (recv without src: c10d asks the work for the sender), and what a
    # point-to-point work answers besides wait(), as gloo's on CPU tensors
    for d in (torch.device("cpu"), dev):
        if rank == 1:
            got = torch.zeros(3, device=d)
            assert dist.recv(got) == 0, d
            assert got.cpu().tolist() == [1.0, 2.0, 3.0], (d, got)
            w = dist.irecv(got)
            typ, msg = _raises(w.get_future, "irecv get_future")
            assert (typ, msg) == (RuntimeError, "Work::getFuture not implemented."), (d, typ, msg)
            w.wait()  # gloo's point-to-point work completes in wait()
            assert w.is_completed() and w._source_rank() == 0, d
            assert got.cpu().tolist() == [4.0, 5.0, 6.0], (d, got)
        elif rank == 0:
            dist.send(torch.tensor([1.0, 2.0, 3.0], device=d), dst=1)
            w = dist.isend(torch.tensor([4.0, 5.0, 6.0], device=d), dst=1)
            typ, msg = _raises(w.get_future, "isend get_future")
            assert (typ, msg) == (RuntimeError, "Work::getFuture not implemented."), (d, typ, msg)
            w.wait()
    dist.barrier()
    # object collectives (pickled through the cpu backend here)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]
    from torch_tpu_eager.distributed import collective_metrics

    m = collective_metrics()
    assert m["collectives"] > 0 and m["per_op"]["all_reduce"]["bytes"] > 0, m
    dist.destroy_process_group()


def _premul_rounded(factor, dtype):
    """The PREMUL_SUM factor as NCCL uses it: rounded to the data's dtype (float32 for bfloat16)."""
    return float(torch.tensor(factor, dtype=torch.float32 if dtype == torch.bfloat16 else dtype).item())


def _check_premul_sum(rank, world, dev, x, dtype):
    """ReduceOp.PREMUL_SUM (gloo has none): NCCL's semantics, each rank's input times the factor
    rounded to the data's scalar type, then SUM; compared bit for bit with gloo's SUM of the
    premultiplied CPU tensors. Factors as a number and as a 1-element "tpu" tensor (per rank)."""
    scalar_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    for factor, op in (
        (1 / 3, dist._make_nccl_premul_sum(1 / 3)),
        (0.5 + rank, dist._make_nccl_premul_sum(torch.tensor([0.5 + rank], dtype=scalar_dtype, device=dev))),
    ):
        c = x.clone().mul_(_premul_rounded(factor, dtype))
        dist.all_reduce(c, op=dist.ReduceOp.SUM)
        t = x.to(dev)
        dist.all_reduce(t, op=op)
        assert_bits(t, c, f"all_reduce PREMUL_SUM({factor}) {dtype}")
        big = _inputs(rank + 70, dtype, (world * 3, 5))
        c = torch.empty_like(x)
        dist.reduce_scatter_tensor(c, big.clone().mul_(_premul_rounded(factor, dtype)))
        t = torch.empty_like(x, device=dev)
        dist.reduce_scatter_tensor(t, big.to(dev), op=op)
        assert_bits(t, c, f"reduce_scatter_tensor PREMUL_SUM({factor}) {dtype}")
        c = x.clone().mul_(_premul_rounded(factor, dtype))
        dist.reduce(c, dst=0)
        t = x.to(dev)
        dist.reduce(t, dst=0, op=op)
        if rank == 0:
            assert_bits(t, c, f"reduce PREMUL_SUM({factor}) {dtype}")


def case_default(rank, world):
    """``init_process_group()`` with no backend picks tpu_ccl for "tpu"; CPU tensors raise NCCL's error."""
    _init(rank, world)
    pg = dist.group.WORLD
    assert "tpu" in [d.type for d in pg._device_types], pg._device_types
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_ccl"
    assert dist.get_backend_config() == "tpu:tpu_ccl", dist.get_backend_config()
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    x = torch.arange(6.0, device=dev).reshape(2, 3) * (rank + 1)
    dist.all_reduce(x)
    assert x.cpu().equal(torch.arange(6.0).reshape(2, 3) * sum(r + 1 for r in range(world)))
    objs = [None] * world
    dist.all_gather_object(objs, ("r", rank))  # object collectives through "tpu" tensors
    assert objs == [("r", r) for r in range(world)]
    lst = [rank * 10] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0]
    dist.barrier()
    try:
        dist.all_reduce(torch.ones(2))
    except RuntimeError as e:
        assert "No backend type associated with device type cpu" in str(e), e
    else:
        raise AssertionError("a CPU tensor on a tpu-only group did not raise")
    # a CPU tensor among tpu tensors: torch picks the backend by the input's device (as for
    # NCCL: a CPU input has no backend here); a CPU output beside a tpu input reaches the
    # backend, which raises NCCL's ValueError "Tensors must be CUDA and dense" for "tpu"
    typ, msg = _raises(
        lambda: dist.all_gather([torch.empty(2, device=dev) for _ in range(world)], torch.ones(2)), "cpu input"
    )
    assert (typ, msg) == (RuntimeError, "No backend type associated with device type cpu"), (typ, msg)
    for what, fn in (
        (
            "all_gather_into_tensor",
            lambda: dist.all_gather_into_tensor(torch.empty(2 * world), torch.ones(2, device=dev)),
        ),
        ("reduce_scatter", lambda: dist.reduce_scatter(torch.empty(2, device=dev), [torch.ones(2)] * world)),
        (
            "all_to_all_single",
            lambda: dist.all_to_all_single(torch.empty(2 * world, device=dev), torch.ones(2 * world)),
        ),
    ):
        typ, msg = _raises(fn, what)
        assert typ is ValueError and msg.startswith("Tensors must be tpu and dense"), (what, typ, msg)
    # a result written into an expanded tensor (stride 0): NCCL's ValueError "Tensors must be
    # contiguous" at the call, on every rank before any communicates; inputs may be expanded
    base = torch.ones(1, device=dev)
    wide = base.expand(4)
    for what, fn in (
        ("all_reduce", lambda: dist.all_reduce(wide)),
        ("broadcast", lambda: dist.broadcast(wide, src=0)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(base.expand(4 * world), wide)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(wide, torch.ones(4 * world, device=dev))),
        ("all_gather", lambda: dist.all_gather([wide] * world, torch.ones(4, device=dev))),
    ):
        typ, msg = _raises(fn, what)
        assert typ is ValueError and msg.startswith("Tensors must be contiguous"), (what, typ, msg)
    assert base.cpu().tolist() == [1.0]
    out = torch.empty(4 * world, device=dev)
    dist.all_gather_into_tensor(out, wide)  # an expanded input is read as gloo reads it
    assert out.cpu().tolist() == [1.0] * (4 * world), out
    # new_group with the backend by name, and the group still works after the errors
    g = dist.new_group(backend="tpu_ccl")
    y = torch.ones(3, device=dev)
    dist.all_reduce(y, group=g)
    assert y.cpu().tolist() == [float(world)] * 3
    dist.destroy_process_group()


def _raises(fn, what):
    """Runs ``fn`` and returns (exception type, first line of its message); fails if nothing is raised
    or if raising took longer than the group's timeout allows."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        assert time.monotonic() - t0 < 20, (what, "took too long")
        return type(e), str(e).splitlines()[0][:300]
    raise AssertionError(f"{what}: no error")


def case_bad_input(rank, world):
    """Mismatched shapes/dtypes across ranks raise torch's collective-mismatch error (plain gloo
    aborts the process there); errors raised at the call are gloo's, type and message."""
    _init(rank, world, "cpu:gloo,tpu:tpu_ccl")
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    report = {}
    n = 4 if rank == 0 else 6
    dt = torch.float32 if rank == 0 else torch.float64
    mismatches = {
        "all_reduce numel": lambda: dist.all_reduce(torch.ones(n, device=dev)),
        "all_reduce dtype": lambda: dist.all_reduce(torch.ones(4, dtype=dt, device=dev)),
        "broadcast shape": lambda: dist.broadcast(torch.ones(2, n, device=dev), src=0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(n * world, device=dev), torch.ones(n, device=dev)
        ),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(n, device=dev), torch.ones(n * world, device=dev)
        ),
        # all-to-alls may differ in size between ranks; what rank i sends to rank j must be what
        # j expects from i (plain gloo aborts the process for the lists, leaves garbage for the splits)
        "all_to_all list": lambda: dist.all_to_all(
            [torch.empty(n, device=dev) for _ in range(world)], [torch.ones(n, device=dev) for _ in range(world)]
        ),
        "all_to_all_single splits": lambda: dist.all_to_all_single(  # rank 0 sends the last rank 2 rows, not 1
            torch.empty(world, 2, device=dev),
            torch.ones(world + (rank == 0), 2, device=dev),
            [1] * world,
            [1] * (world - 1) + [1 + (rank == 0)],
        ),
        "all_to_all_single dtype": lambda: dist.all_to_all_single(
            torch.empty(world, dtype=dt, device=dev), torch.ones(world, dtype=dt, device=dev)
        ),
    }
    for what, fn in mismatches.items():
        typ, msg = _raises(fn, what)
        assert typ is RuntimeError and "Detected mismatch between collectives" in msg, (what, typ, msg)
        if what == "all_reduce numel":  # both ranks' collectives are named, as torch's wrapper names them
            assert "OpType=ALLREDUCE, TensorShape=[[4]]" in msg and "TensorShape=[[6]]" in msg, msg
        if what == "all_to_all_single splits":
            assert f"Rank 0 sends 4 elements of float32 to rank {world - 1} in ALLTOALL_BASE" in msg, msg
        if what == "all_to_all list":
            assert "Rank 0 sends 4 elements of float32 to rank 1 in ALLTOALL, but Rank 1 expects 6" in msg, msg
        report[what] = msg[:100]

    # errors raised at the call: the same type and message as gloo on CPU tensors
    def same(what, cpu_fn, tpu_fn):
        a, b = _raises(cpu_fn, what), _raises(tpu_fn, what)
        assert a == b, (what, a, b)
        report[what] = a

    for op in ("sum", 17):
        same(
            f"op {op!r}",
            lambda: dist.all_reduce(torch.ones(2), op=op),
            lambda: dist.all_reduce(torch.ones(2, device=dev), op=op),
        )
    # ReduceOp.PREMUL_SUM: gloo has none; NCCL's errors (ProcessGroupNCCL getNcclReduceOp / the factor's dtype)
    typ, msg = _raises(
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64, device=dev), op=dist._make_nccl_premul_sum(2.0)),
        "PREMUL_SUM int64",
    )
    assert (typ, msg) == (TypeError, "PreMulSum Data type must be half, float, bfloat16 or double"), (typ, msg)
    report["PREMUL_SUM int64"] = msg
    f64 = dist._make_nccl_premul_sum(torch.tensor([2.0], dtype=torch.float64, device=dev))
    typ, msg = _raises(lambda: dist.all_reduce(torch.ones(2, device=dev), op=f64), "PREMUL_SUM factor dtype")
    assert typ is RuntimeError and msg == "expected scalar type Float but found Double", (typ, msg)
    report["PREMUL_SUM float64 factor, float32 data"] = msg
    same(
        "int AVG",
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64, device=dev), op=dist.ReduceOp.AVG),
    )
    same(
        "all_gather_into_tensor local size",
        lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)),
        lambda: dist.all_gather_into_tensor(torch.empty(3, device=dev), torch.ones(2, device=dev)),
    )
    same(
        "int16",
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)),
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16, device=dev)),
    )
    # the group and the device still work after all that
    x = torch.ones(3, device=dev)
    dist.all_reduce(x)
    assert x.cpu().tolist() == [float(world)] * 3
    if rank == 0:
        for k, v in report.items():
            print(f"  {k}: {v}")
    dist.destroy_process_group()


def case_failing_rank(rank, world):
    """A rank that stays alive but skips a collective: the others get gloo's timeout error at the
    group's timeout. Then rank 1 raises (its process exits) before a collective; the others get an
    error from it within the timeout."""
    _init(rank, world, timeout=datetime.timedelta(seconds=10))
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    x = torch.ones(1 << 16, device=dev)
    dist.all_reduce(x)  # a healthy collective first
    side = dist.new_group(backend="tpu_ccl", timeout=datetime.timedelta(seconds=3))
    if rank == 1:
        time.sleep(5)  # alive, but never joins the collective on `side`
        raise RuntimeError("rank 1 failed on purpose")
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device=dev), group=side)
    except RuntimeError as e:
        elapsed = time.monotonic() - t0
        assert "Timed out" in str(e) and 2.5 < elapsed < 15, (elapsed, e)
        print(f"rank {rank}: timed out after {elapsed:.1f}s: {str(e).splitlines()[0][:120]}", flush=True)
    else:
        raise AssertionError("a collective a live peer never joined did not time out")
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        x.cpu()
    except RuntimeError as e:
        elapsed = time.monotonic() - t0
        print(f"rank {rank}: got {type(e).__name__} after {elapsed:.1f}s: {str(e).splitlines()[0][:120]}", flush=True)
        assert elapsed < 25, elapsed
        # the device and its queue stay usable
        assert (torch.ones(2, device=dev) + 1).cpu().tolist() == [2.0, 2.0]
        os._exit(0)  # the group is broken: skip destroy_process_group's barrier
    raise AssertionError("the collective after a peer failed did not raise")


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )


def _data(steps, batch):
    g = torch.Generator().manual_seed(7)
    return torch.randn(steps, batch, 8, generator=g), torch.randint(0, 4, (steps, batch), generator=g)


def _cpu_reference(steps, batch, accumulate_first=False):
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = _data(steps, batch)
    losses = []
    for s in range(steps):
        loss = torch.nn.functional.cross_entropy(model(xs[s]), ys[s])
        loss.backward()
        losses.append(loss.item())
        if accumulate_first and s == 0:
            continue
        opt.step()
        opt.zero_grad()
    return model, losses


def case_ddp(rank, world):
    """DDP (small buckets, no_sync) on "tpu" equals single-process CPU training on the global batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    _init(rank, world)
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    steps, batch = 4, 8 * world
    ref, ref_losses = _cpu_reference(steps, batch, accumulate_first=True)
    torch.manual_seed(0)
    model = _mlp()
    torch.manual_seed(1234 + rank)  # DDP's initial broadcast must make the ranks equal
    if rank != 0:
        for p in model.parameters():
            p.data.add_(torch.randn_like(p))
    model = model.to(dev)
    ddp = DDP(model, bucket_cap_mb=0.0005)  # several buckets (the model has ~2.5 KB of float32)
    from torch_tpu_eager.distributed import collective_metrics, reset_collective_metrics

    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    xs, ys = _data(steps, batch)
    lo, hi = rank * 8, (rank + 1) * 8
    for s in range(steps):
        x, y = xs[s, lo:hi].to(dev), ys[s, lo:hi].to(dev)
        if s == 0:
            reset_collective_metrics()
            with ddp.no_sync():  # accumulate locally; the next backward reduces both
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            assert collective_metrics()["collectives"] == 0, collective_metrics()
            continue
        reset_collective_metrics()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        n = collective_metrics()["per_op"]["all_reduce"]["count"]
        assert s < 2 or n >= 2, f"expected several gradient buckets (rebuilt after step 1), got {n} all_reduce"
        opt.step()
        opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
    # DDP's runtime statistics, sampled by the c10d Timer of the device type as on CPU and
    # CUDA (without one DDP warns "Time stats are currently only collected for CPU and CUDA").
    stats = ddp._get_ddp_logging_data()
    for k in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert stats.get(k, 0) > 0, (k, stats)
    dist.destroy_process_group()


def case_fsdp(rank, world):
    """FSDP2 fully_shard (f32; bf16 params with f32 reduce; a gradient divide factor, which FSDP2
    reduces with ReduceOp.PREMUL_SUM) equals single-process CPU training."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _init(rank, world)
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    steps, batch = 3, 4 * world
    xs, ys = _data(steps, batch)
    lo, hi = rank * 4, (rank + 1) * 4
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # divide factor 4 (not the group size): FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM(1/4)
    for mp, divide in ((None, None), (bf16, None), (None, 4.0)):
        torch.manual_seed(0)
        ref = _mlp()
        torch.manual_seed(0)
        model = _mlp().to(dev)
        kw = {"mp_policy": mp} if mp is not None else {}
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        premuls = []
        if divide is not None:
            for m in (model[0], model[2], model[4], model):
                m.set_gradient_divide_factor(divide)
            from torch_tpu_eager.distributed import backend as tpu_ccl

            plain = tpu_ccl._premultiply
            tpu_ccl._premultiply = lambda h, p: (premuls.append(p) if p is not None else None, plain(h, p))[1]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for s in range(steps):
            loss = torch.nn.functional.cross_entropy(model(xs[s, lo:hi].to(dev)), ys[s, lo:hi].to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if mp is None:
                rloss = torch.nn.functional.cross_entropy(ref(xs[s]), ys[s])
                # the sum of the ranks' mean-loss gradients over `divide`: world / divide times the global one
                (rloss * (world / divide) if divide is not None else rloss).backward()
            else:  # the reference computes in bf16 too, from f32 master weights
                _bf16_backward(ref, xs[s], ys[s])
            ref_opt.step()
            ref_opt.zero_grad()
        if divide is not None:
            tpu_ccl._premultiply = plain
            assert premuls and all(p[0] == 1 / divide for p in premuls), premuls  # FSDP2 used PREMUL_SUM
        tol = dict(rtol=1e-5, atol=1e-6) if mp is None else dict(rtol=2e-2, atol=2e-3)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            assert full.dtype == torch.float32, full.dtype
            torch.testing.assert_close(full.detach().cpu(), q.detach(), msg=name, **tol)
    dist.destroy_process_group()


def _bf16_backward(ref, x, y):
    """CPU reference of FSDP2 mixed precision: bf16 copies of the f32 params compute; f32 grads."""
    import torch.func

    params = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in ref.named_parameters()}
    out = torch.func.functional_call(ref, params, (x.to(torch.bfloat16),))
    loss = torch.nn.functional.cross_entropy(out, y)
    grads = torch.autograd.grad(loss, list(params.values()))
    for (k, p), gr in zip(ref.named_parameters(), grads):
        p.grad = gr.float()


def case_dtensor_tp(rank, world):
    """DTensor on init_device_mesh("tpu"), tensor parallel (Colwise/Rowwise) and DCP save/load."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init(rank, world)
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    mesh = init_device_mesh("tpu", (world,))
    assert mesh.device_type == "tpu"
    # DTensor: shard, compute, redistribute
    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    da = distribute_tensor(a.to(dev), mesh, [Shard(0)])
    db = distribute_tensor(b.to(dev), mesh, [Replicate()])
    assert da.to_local().shape == (8 // world, 6) and da.to_local().device == dev
    dc = da @ db
    full = dc.redistribute(mesh, [Replicate()]).to_local()
    torch.testing.assert_close(full.cpu(), a @ b)
    s = (da * 2).sum()
    torch.testing.assert_close(s.full_tensor().cpu(), (a * 2).sum())
    torch.testing.assert_close(da.redistribute(mesh, [Shard(1)]).full_tensor().cpu(), a)
    # tensor parallel MLP training step against CPU
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).to(dev)
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert isinstance(model[0].weight, DTensor)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randn(5, 8, generator=g)
        out = model(x.to(dev))
        loss = (out**2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        rloss = (ref(x) ** 2).mean()
        rloss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.detach().cpu(), rloss.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
    # distributed checkpoint: save the sharded state dict, load it into a fresh model
    import torch.distributed.checkpoint as dcp

    path = os.environ["TPU_DIST_TMP"]
    sd = model.state_dict()
    dcp.save(sd, checkpoint_id=path)
    torch.manual_seed(99)
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).to(dev)
    fresh = parallelize_module(fresh, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    sd2 = fresh.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    fresh.load_state_dict(sd2)
    for (name, p), q in zip(fresh.named_parameters(), ref.parameters()):
        assert p.to_local().device == dev
        torch.testing.assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
    dist.destroy_process_group()


def _sim_seconds(fn, dev):
    """Simulated seconds of ``fn()`` on the current stream of ``dev`` (an Event pair around it)."""
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record(torch.tpu.current_stream(dev))
    fn()
    end.record(torch.tpu.current_stream(dev))
    return start.elapsed_time(end) / 1e3


def case_overlap(rank, world):
    """Collectives on the chip's interconnect stream: an async all_reduce overlaps the compute
    recorded after it until wait(); the simulated times follow the model (serial: comm +
    compute; overlapped: max of the two), the values do not change; DDP's bucketed all_reduce
    overlaps backward; torch.profiler shows the collective on the interconnect stream's track."""
    import torch_tpu_eager
    from torch_tpu_eager import ici
    from torch_tpu_eager.distributed import collective_metrics, ici_stream, reset_collective_metrics

    _init(rank, world)
    dev = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(dev)
    n = 1 << 20  # float32: 4 MiB
    comm = ici.collective_time("all_reduce", 4 * n, world)
    g = torch.Generator().manual_seed(5)
    a_cpu = torch.randn(256, 256, generator=g) / 16
    a = a_cpu.to(dev)
    out = {}

    def compute(reps):
        y = a
        for _ in range(reps):
            y = torch.tanh(y @ a)
        out["y"] = y
        torch.tpu.current_stream(dev).synchronize()  # run it: its kernels' time is on the clock

    torch.tpu.synchronize()
    one = _sim_seconds(lambda: compute(1), dev)
    # enough compute to hide the collective (overlapped = comm... = compute) and too little (= comm)
    for reps in (1, max(2, int(comm / one) + 2)):
        k = _sim_seconds(lambda: compute(reps), dev)
        buf = torch.full((n,), float(rank + 1), device=dev)
        serial = _sim_seconds(lambda: (dist.all_reduce(buf), compute(reps)), dev)
        expect = torch.full((n,), float(world * (world + 1) // 2))
        assert torch.equal(buf.cpu(), expect)

        b = torch.full((n,), float(rank + 1), device=dev)

        def overlapped():
            work = dist.all_reduce(b, async_op=True)
            compute(reps)
            work.wait()

        both = _sim_seconds(overlapped, dev)
        assert torch.equal(b.cpu(), expect)
        torch.testing.assert_close(out["y"].cpu(), _cpu_chain(a_cpu, reps), rtol=1e-5, atol=1e-6)
        assert abs(serial - (comm + k)) <= 1e-9 + 1e-6 * serial, (reps, serial, comm, k)
        assert abs(both - max(comm, k)) <= 1e-9 + 1e-6 * both, (reps, both, comm, k)
        assert both < serial, (both, serial)
        if rank == 0:
            print(
                f"  {reps} matmuls: compute {k * 1e6:.1f} us, all_reduce {comm * 1e6:.1f} us, "
                f"serial {serial * 1e6:.1f} us, overlapped {both * 1e6:.1f} us",
                flush=True,
            )
    # a future of the work joins as wait() does
    b = torch.ones(n, device=dev)
    t = _sim_seconds(lambda: dist.all_reduce(b, async_op=True).get_future().wait(), dev)
    assert abs(t - comm) <= 1e-9 + 1e-6 * t, (t, comm)
    # DDP: the buckets' all_reduce overlaps the rest of backward
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
    ).to(dev)
    ddp = DDP(model, bucket_cap_mb=1)
    x = torch.randn(64, 256, generator=g).to(dev)
    for step in range(3):  # buckets are rebuilt after the first step
        torch.tpu.synchronize()
        before = torch_tpu_eager.metrics()
        reset_collective_metrics()
        t = _sim_seconds(lambda: ddp(x).square().mean().backward(), dev)
        after = torch_tpu_eager.metrics()
        comm_s = collective_metrics()["collective_time_s"]
        kernels = (after["sim_time_s"] - after["collective_time_s"]) - (
            before["sim_time_s"] - before["collective_time_s"]
        )
        buckets = collective_metrics()["per_op"]["all_reduce"]["count"]
    assert buckets >= 2, buckets
    assert max(kernels, comm_s) <= t + 1e-12 and t < kernels + comm_s, (t, kernels, comm_s)
    if rank == 0:
        print(
            f"  DDP backward ({buckets} buckets): kernels {kernels * 1e6:.1f} us, all_reduce {comm_s * 1e6:.1f} us, "
            f"step {t * 1e6:.1f} us",
            flush=True,
        )
    # torch.profiler: the collective is a device event on the interconnect stream's track
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        b = torch.ones(n, device=dev)
        work = dist.all_reduce(b, async_op=True)
        compute(1)
        work.wait()
    path = os.path.join(os.environ["TPU_DIST_TMP"], f"trace{rank}.json")
    prof.export_chrome_trace(path)
    import json

    with open(path) as f:
        events = json.load(f)["traceEvents"]
    coll = [e for e in events if e.get("name") == "ici::all_reduce" and e.get("cat") == "kernel"]
    assert len(coll) == 1, [e.get("name") for e in events][:50]
    kernels_on = {e["tid"] for e in events if e.get("cat") == "kernel" and e.get("name") != "ici::all_reduce"}
    lane = ici_stream(dev).stream_id
    assert (coll[0]["pid"], coll[0]["tid"], coll[0]["args"]["stream"]) == (dev.index, lane, lane), coll[0]
    assert kernels_on and lane not in kernels_on, (coll[0], kernels_on)  # the matmuls: the default stream's track
    _check_ddp_trace(rank, world, ddp, x, dev, lane)
    dist.destroy_process_group()


def _check_ddp_trace(rank, world, ddp, x, dev, lane):
    """The Chrome trace of a DDP step (torch.profiler, ProfilerActivity.PrivateUse1) shows the
    device tracks on the simulated clock: a bucket's all_reduce on the interconnect stream's
    track overlaps backward kernels on the compute track; what depends on a collective does
    not overlap it; each collective lasts the ICI model's time for its bytes."""
    import json

    from torch.profiler import ProfilerActivity, profile

    from torch_tpu_eager import ici

    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        ddp(x).square().mean().backward()
        torch.tpu.synchronize()  # the optimizer's kernels apart from the gradients' copy back
        opt.step()  # DDP waited for every bucket's future at the end of backward
        torch.tpu.synchronize()
        opt.zero_grad()
    path = os.path.join(os.environ["TPU_DIST_TMP"], f"ddp_trace{rank}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ns = 3e-3  # us: whole-ns timestamps
    dev_events = [e for e in events if e.get("cat") == "kernel" and e["pid"] == dev.index]
    colls = sorted((e for e in dev_events if e["name"] == "ici::all_reduce"), key=lambda e: e["ts"])
    compute = sorted((e for e in dev_events if not e["name"].startswith("ici::")), key=lambda e: e["ts"])
    assert len(colls) >= 2 and compute, ([e["name"] for e in dev_events], len(colls))
    assert {e["tid"] for e in colls} == {lane} and lane not in {e["tid"] for e in compute}
    for c in colls:  # the cost model's time for the bucket's bytes
        expect_us = ici.collective_time("all_reduce", int(c["args"]["bytes"]), world) * 1e6
        assert abs(c["dur"] - expect_us) <= 1e-3, (c, expect_us)
    for a, b in zip(colls, colls[1:]):  # one interconnect stream: its collectives follow each other
        assert a["ts"] + a["dur"] <= b["ts"] + ns, (a, b)
    by_track: dict = {}
    for k in compute:
        by_track.setdefault(k["tid"], []).append(k)
    for track in by_track.values():  # one stream's kernels follow each other
        for a, b in zip(track, track[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + ns, (a, b)

    def overlap(k, c):
        return min(k["ts"] + k["dur"], c["ts"] + c["dur"]) - max(k["ts"], c["ts"])

    hidden = sum(max(0.0, overlap(k, c)) for k in compute for c in colls)
    assert hidden > 1.0, hidden  # us of all_reduce under compute kernels (backward, the first bucket's copy back)
    # what uses the reduced gradients does not overlap their all_reduce: the optimizer's
    # kernels (linked to the ops inside its step) start after the last bucket's ends
    (step,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")]
    in_step = {
        e["args"]["External id"]
        for e in events
        if e.get("cat") == "cpu_op" and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
    }
    opt_kernels = [k for k in compute if k["args"].get("External id") in in_step]
    last_end = max(c["ts"] + c["dur"] for c in colls)
    assert opt_kernels and all(k["ts"] >= last_end - ns for k in opt_kernels), (last_end, opt_kernels[:3])
    if rank == 0:
        comm = sum(c["dur"] for c in colls)
        print(
            f"  DDP step trace: {len(colls)} all_reduce ({comm:.1f} us) on the interconnect track, "
            f"{hidden:.1f} us of them under compute kernels",
            flush=True,
        )


def _cpu_chain(a, reps):
    y = a
    for _ in range(reps):
        y = torch.tanh(y @ a)
    return y


def case_chips(rank, world):
    """Several chips in one process: rank r drives chips 2r and 2r+1 (TORCH_TPU_NUM_DEVICES >= 2 x
    world); collectives on either chip, the non-current one included, equal gloo on CPU bit for bit,
    each charged to its own chip's simulated clock only, on that chip's interconnect stream."""
    import torch_tpu_eager
    from torch_tpu_eager.distributed import ici_stream

    assert torch.tpu.device_count() >= 2 * world, torch.tpu.device_count()
    _init(rank, world, "cpu:gloo,tpu:tpu_ccl")
    chips = [torch.device("tpu", 2 * rank), torch.device("tpu", 2 * rank + 1)]
    torch.tpu.set_device(chips[0])
    clock = torch_tpu_eager._C._chip_sim_time
    for k, dev in enumerate(chips):
        other = chips[1 - k]
        torch.tpu.synchronize(other)
        other_t0, t0 = clock(other.index), clock(dev.index)
        x = _inputs(rank + 10 * k, torch.float32, (64, 33))
        c = x.clone()
        dist.all_reduce(c)
        t = x.to(dev)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        assert t.device == dev
        assert_bits(t, c, f"all_reduce on {dev}")
        c = torch.empty(world * 64, 33)
        dist.all_gather_into_tensor(c, x)
        t = torch.empty(world * 64, 33, device=dev)
        dist.all_gather_into_tensor(t, x.to(dev))
        assert_bits(t, c, f"all_gather_into_tensor on {dev}")
        torch.tpu.synchronize(dev)
        assert clock(dev.index) > t0 and clock(other.index) == other_t0, (dev, clock(dev.index), t0)
        assert ici_stream(dev).device_index == dev.index
    # both chips' collectives in flight at once, then waited for
    xs = [torch.full((8,), float(rank + 1 + k), device=d) for k, d in enumerate(chips)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    for w in works:
        w.wait()
    for k, x in enumerate(xs):
        assert x.cpu().tolist() == [float(sum(r + 1 + k for r in range(world)))] * 8
    dist.destroy_process_group()


def case_api(rank, world):
    """case_default, case_bad_input and case_chips in one pair of processes."""
    case_default(rank, world)
    case_bad_input(rank, world)
    case_chips(rank, world)


def case_parallel(rank, world):
    """DDP, FSDP2, DTensor / tensor parallel / checkpoint in one pair of processes."""
    for case in (case_ddp, case_fsdp, case_dtensor_tp):
        t0 = time.monotonic()
        case(rank, world)
        if os.environ.get("TPU_DIST_VERBOSE"):
            print(rank, case.__name__, f"{time.monotonic() - t0:.1f}s", flush=True)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def _rank_main(rank, world, case, port, tmp):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), TPU_DIST_TMP=tmp
    )
    import torch_tpu_eager  # noqa: F401

    # one intra-op thread per rank, as torchrun sets: OpenMP threads of several processes
    # spinning against each other made every host copy ~100x slower on a loaded host
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    verbose = os.environ.get("TPU_DIST_VERBOSE")
    if verbose:
        print(rank, "imported", time.time(), flush=True)
    try:
        CASES[case](rank, world)
        if verbose:
            print(rank, "case done", time.time(), flush=True)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait in destroy/atexit for peers that may be gone
    if rank == 0:
        print(f"{case} OK", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the case destroyed its group; skip the interpreter's teardown (seconds per rank)


def _torch_spawn(case, world, port, tmp, deadline):
    """Runs ``case`` in ``world`` processes started by ``torch.multiprocessing.spawn`` (not
    joined past ``deadline``). Returns
    (exit codes, ranks that hung)."""
    import torch.multiprocessing as tmp_mp

    ctx = tmp_mp.spawn(_rank_main, args=(world, case, port, tmp), nprocs=world, join=False)
    try:
        while not ctx.join(timeout=max(0.5, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                break
    except tmp_mp.ProcessRaisedException:
        pass
    except tmp_mp.ProcessExitedException:
        pass
    hung = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in ctx.processes], hung


def main(argv):
    case = argv[0]
    world = int(argv[1]) if len(argv) > 1 else 2
    import multiprocessing as mp

    if case.startswith("torch_spawn:"):  # the same case, launched by torch.multiprocessing
        with tempfile.TemporaryDirectory() as tmp:
            deadline = time.monotonic() + float(os.environ.get("TPU_DIST_DEADLINE", 400))
            codes, hung = _torch_spawn(case.split(":", 1)[1], world, _free_port(), tmp, deadline)
        print(f"exit codes {codes}" + (f", ranks {hung} hung" if hung else ""), flush=True)
        return 0 if all(c == 0 for c in codes) else 1

    ctx = mp.get_context("spawn")
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank_main, args=(r, world, case, port, tmp)) for r in range(world)]
        for p in procs:
            p.start()
        if os.environ.get("TPU_DIST_VERBOSE"):
            print("started", time.time(), flush=True)
        deadline = time.monotonic() + float(os.environ.get("TPU_DIST_DEADLINE", 400))
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
        codes = [p.exitcode for p in procs]
    if os.environ.get("TPU_DIST_VERBOSE"):
        print("joined", time.time(), flush=True)
    print(f"exit codes {codes}" + (f", ranks {hung} hung" if hung else ""), flush=True)
    if case == "failing_rank":
        return 0 if codes[0] == 0 and all(c not in (0, None) for c in codes[1:2]) and not hung else 1
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
