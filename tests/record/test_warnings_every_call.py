"""A call whose meta inference warns warns on every call, as CPU's kernel does, and only
at the call: the flush runs CPU's kernel, which would give the warning a second time.

The meta cache serves repeated calls without running the meta kernel; a warning the
meta kernel gives (an out= tensor with elements resized, a uint8 index mask) must not
be lost on the second call. PyTorch's test_ops.py `test_out_warning` calls each op
twice in one process (245 of its float32 tests failed on "tpu" without this).
"""

import warnings

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

CALLS = {
    "unary out= resized": lambda x: torch.acos(x, out=torch.empty(7, device=x.device)),
    "binary out= resized": lambda x: torch.add(x, x, out=torch.empty(2, device=x.device)),
    "cat out= resized": lambda x: torch.cat([x, x], out=torch.empty(2, device=x.device)),
    "reduction out= resized": lambda x: torch.sum(x, 0, out=torch.empty(3, device=x.device)),
    "uint8 mask": lambda x: x[torch.tensor([1, 0, 1, 0, 1], dtype=torch.uint8)],
    "uint8 mask in a region": lambda x: (x * 2)[torch.tensor([0, 1, 1, 0, 1], dtype=torch.uint8)].exp() + 1,
    "out= empty: no warning": lambda x: torch.acos(x, out=torch.empty(0, device=x.device)),
    "out= right shape: no warning": lambda x: torch.acos(x, out=torch.empty(5, device=x.device)),
}


def warning_texts(fn, device):
    x = torch.linspace(-0.9, 0.9, 5, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(x)
    return [str(w.message) for w in caught], out


@pytest.mark.parametrize("name", list(CALLS))
def test_each_call_warns_as_on_cpu(name):
    fn = CALLS[name]
    for _ in range(3):  # the first call fills the meta cache; the others must warn the same
        want, want_out = warning_texts(fn, "cpu")
        got, got_out = warning_texts(fn, "tpu")
        assert got == want
        torch.testing.assert_close(got_out.cpu(), want_out)


def test_only_the_call_that_warns_is_not_cached():
    # The resizing call adds no meta-cache entry; the same op into an out= of the right
    # shape still does (a program without warnings keeps its cache hits).
    from torch_tpu_eager import _C

    x = torch.linspace(-0.9, 0.9, 6, device="tpu")
    resized, right = torch.empty(7, device="tpu"), torch.empty(6, device="tpu")
    before = _C._meta_cache_stats()["entries"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.acos(x, out=resized)
    middle = _C._meta_cache_stats()["entries"]
    torch.acos(x, out=right)
    after = _C._meta_cache_stats()["entries"]
    assert (middle - before, after - middle) == (0, 1)
    torch.testing.assert_close(resized.cpu(), right.cpu())


@pytest.mark.parametrize("name", list(CALLS))
def test_reading_the_result_warns_no_more(name):
    """The read flushes; the kernels it runs give no warning the call gave already
    (a uint8 mask's deprecation came twice: at the call and at the read)."""
    for _ in range(2):
        want, want_out = warning_texts(lambda x: CALLS[name](x).cpu(), "cpu")
        got, got_out = warning_texts(lambda x: CALLS[name](x).cpu(), "tpu")
        assert got == want
        torch.testing.assert_close(got_out, want_out)
