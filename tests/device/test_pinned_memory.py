"""Pinned host memory for "tpu": pin_memory, pin_memory_device, non_blocking copies (CUDA's contract)."""

import torch

from difftest import requires_tpu

pytestmark = requires_tpu

# ---- pinned memory ----


def test_pin_memory_gives_pinned_tensors():
    t = torch.randn(10)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.is_pinned() and p[2:5].is_pinned() and p.device.type == "cpu"
    assert torch.equal(p, t)
    u = torch.empty(4, pin_memory=True)
    assert u.is_pinned()
    s = torch.randn(10).untyped_storage()
    assert not s.is_pinned("tpu")
    assert s.pin_memory("tpu").is_pinned("tpu")


def test_non_blocking_copies_of_pinned_memory():
    p = torch.arange(6.0).pin_memory()
    d = p.to("tpu", non_blocking=True) * 2
    back = torch.empty(6).pin_memory()
    back.copy_(d, non_blocking=True)
    torch.tpu.synchronize()
    assert back.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_dataloader_pin_memory():
    ds = torch.utils.data.TensorDataset(torch.arange(8.0))
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True, pin_memory_device="tpu")))
    assert batch[0].is_pinned()
