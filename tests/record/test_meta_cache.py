"""The record path's meta-inference cache must not outlive the state it depends on."""

import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def test_default_dtype_change_is_not_served_from_the_meta_cache():
    # int tensor * float scalar promotes to the default dtype: the same op on the same
    # argument metadata must follow a torch.set_default_dtype in between.
    x_cpu = torch.arange(4)
    x = x_cpu.to("tpu")
    before = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            for fn in (lambda t: t * 0.5, lambda t: t / 2, lambda t: t + 1.5):
                got, want = fn(x), fn(x_cpu)
                assert got.dtype == want.dtype == dtype
                torch.testing.assert_close(got.cpu(), want)
    finally:
        torch.set_default_dtype(before)
