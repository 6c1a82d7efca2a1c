"""Generator API of "tpu": offsets, graph-safe state, per-chip generators and manual_seed_all (CUDA's contract)."""

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

# ---- generator API ----


def test_generator_offset_and_graphsafe_state():
    g = torch.Generator(device="tpu")
    g.manual_seed(3)
    assert g.get_offset() == 0
    a = torch.rand(4, device="tpu", generator=g).cpu()
    assert g.get_offset() == 1
    g.set_offset(0)
    torch.testing.assert_close(torch.rand(4, device="tpu", generator=g).cpu(), a)
    state = g.graphsafe_get_state()
    assert state.get_offset() == g.get_offset() and state.initial_seed() == 3
    b = torch.rand(4, device="tpu", generator=g).cpu()
    g.graphsafe_set_state(state)
    torch.testing.assert_close(torch.rand(4, device="tpu", generator=g).cpu(), b)


def test_manual_seed_all_seeds_every_chip():
    torch.tpu.manual_seed_all(11)
    for gen in torch.tpu.default_generators:
        assert gen.initial_seed() == 11 and gen.get_offset() == 0
    torch.manual_seed(12)
    assert all(gen.initial_seed() == 12 for gen in torch.tpu.default_generators)


def test_generator_bad_device():
    with pytest.raises(torch.AcceleratorError):
        torch.Generator(device=f"tpu:{torch.tpu.device_count()}")
