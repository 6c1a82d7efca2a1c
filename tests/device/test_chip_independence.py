"""Each chip's queue flushes independently of the other chips' (CUDA: work on one device
does not wait for another device's kernels).

The case: a custom op's "tpu" kernel, run by tpu:0's flush, starts a thread that reads,
synchronizes or records on tpu:1 and joins it. The thread must finish while tpu:0's flush
is still running (before this, it waited for tpu:0's flush to end: the join hung). Each
program runs in a subprocess with a timeout, so a regression fails instead of hanging
the suite. Values are compared with the same computation on CPU.
"""

import pytest

from difftest import requires_tpu, run_python

PROGRAM = """
import threading, torch, torch_tpu_eager
assert torch.tpu.device_count() >= 2
mode, pending = {mode!r}, {pending!r}
other1 = torch.arange(4.0, device="tpu:1")
if pending:
    other1 = other1 * 2 + 1  # queued on tpu:1 when the side thread runs
else:
    torch.tpu.synchronize(1)
expected = torch.arange(4.0) * 2 + 1 if pending else torch.arange(4.0)
got = {{}}

@torch.library.custom_op("rt25_{mode}_{pending}::k", mutates_args=())
def k(x: torch.Tensor) -> torch.Tensor:
    return x + 1

@k.register_kernel("tpu")
def _(x):
    def side():
        if mode == "read":
            got["value"] = other1.cpu()
        elif mode == "synchronize":
            torch.tpu.synchronize(1)
            got["value"] = other1.cpu()
        elif mode == "record":
            got["value"] = (other1 * 3).cpu()
    t = threading.Thread(target=side)
    t.start()
    t.join({join_s})
    got["finished"] = not t.is_alive()
    return x + 1

k.register_fake(lambda x: torch.empty_like(x))
r = k(torch.ones(3, device="tpu:0"))
torch.testing.assert_close(r.cpu(), torch.full((3,), 2.0))  # tpu:0's flush runs the kernel
assert got["finished"], "the side thread waited for tpu:0's flush"
want = expected * 3 if mode == "record" else expected
torch.testing.assert_close(got["value"], want, rtol=0, atol=0)
print("ok")
"""


@requires_tpu
@pytest.mark.parametrize("pending", [False, True], ids=["idle", "pending"])
@pytest.mark.parametrize("mode", ["read", "synchronize", "record"])
def test_kernel_thread_uses_other_chip_during_flush(mode, pending):
    # 120 s join: the shared machine runs at a load of 10-30; the flush of tpu:1 is a few ops.
    p = run_python(PROGRAM.format(mode=mode, pending=pending, join_s=120), timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


@requires_tpu
def test_same_chip_read_from_kernel_thread_waits_for_the_flush():
    # The flushed chip's own reads still wait for its flush (its results are in flight):
    # a thread the kernel starts that reads tpu:0 finishes only after the flush.
    code = """
    import threading, time, torch, torch_tpu_eager
    a = torch.arange(4.0, device="tpu:0") + 1
    got = {}

    @torch.library.custom_op("rt25_same::k", mutates_args=())
    def k(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @k.register_kernel("tpu")
    def _(x):
        def side():
            got["value"] = a.cpu()
        t = threading.Thread(target=side)
        t.start()
        t.join(2)
        got["during"] = t.is_alive()
        got["thread"] = t
        return x + 1

    k.register_fake(lambda x: torch.empty_like(x))
    r = k(a)
    torch.testing.assert_close(r.cpu(), torch.arange(4.0) + 2)
    got["thread"].join(120)
    assert got["during"], "a read of the flushed chip did not wait for its flush"
    torch.testing.assert_close(got["value"], torch.arange(4.0) + 1, rtol=0, atol=0)
    print("ok")
    """
    p = run_python(code, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
