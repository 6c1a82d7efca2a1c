"""Pinned host memory, generator API and autoload of the "tpu" device."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# ---- autoload (torch.backends entry point) ----


def _run_with_entry_point(tmp_path, code, env_extra=None):
    dist = tmp_path / "torch_tpu_eager_ep-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_tpu_eager_ep\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntpu = torch_tpu_eager._autoload:load\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env.update(env_extra or {})
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_torch_alone_makes_tpu_available(tmp_path):
    out = _run_with_entry_point(
        tmp_path,
        """
        import sys, torch
        dynamo = "torch._dynamo" in sys.modules  # autoload must not import Dynamo (~1 s)
        x = torch.ones(3, device="tpu") * 2
        print(x.sum().item(), hasattr(torch, "tpu"), dynamo)
    """,
    )
    assert out.splitlines()[-1] == "6.0 True False"


def test_importing_the_package_first_works_with_autoload(tmp_path):
    # import torch_tpu_eager imports torch, whose autoload calls the entry point while
    # the package is still initializing: it must not need the package's attributes.
    out = _run_with_entry_point(
        tmp_path,
        """
        import torch_tpu_eager, torch
        print((torch.ones(2, device="tpu") + 1).cpu().tolist())
    """,
    )
    assert out.splitlines()[-1] == "[2.0, 2.0]"
    out = subprocess.run(
        [sys.executable, "-m", "torch_tpu_eager.env"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT])),
    )
    assert out.returncode == 0 and "TORCH_TPU_TARGET" in out.stdout, out.stderr


def test_autoload_can_be_turned_off(tmp_path):
    out = _run_with_entry_point(
        tmp_path,
        """
        import sys, torch
        print("torch_tpu_eager" in sys.modules)
    """,
        {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert out.splitlines()[-1] == "False"
