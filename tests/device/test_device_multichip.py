"""Several simulated chips per process, against CUDA's multi-device contract."""

import os

import pytest
import torch

from difftest import requires_tpu, run_python
from threaded import run_threads

pytestmark = requires_tpu


def _C():
    import torch_tpu_eager

    return torch_tpu_eager._C


N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0
two_chips = pytest.mark.skipif(N < 2, reason="needs TORCH_TPU_NUM_DEVICES >= 2")


def test_device_count_default_and_env():
    assert N == int(os.environ.get("TORCH_TPU_NUM_DEVICES", "2"))
    assert torch.accelerator.device_count() == N
    assert len(torch.tpu.default_generators) == N


def test_device_count_is_fixed_after_first_use():
    with pytest.raises(RuntimeError, match="before the device is first used"):
        torch.tpu.set_device_count(N + 1)
    torch.tpu.set_device_count(N)  # the same count: no error
    with pytest.raises(ValueError):
        torch.tpu.set_device_count(0)
    with pytest.raises(TypeError):
        torch.tpu.set_device_count("2")


@two_chips
def test_tensors_live_on_their_chip_and_compute_as_cpu():
    a = torch.arange(6.0).reshape(2, 3)
    t1 = a.to("tpu:1")
    assert t1.device == torch.device("tpu", 1) and t1.get_device() == 1
    r = (t1 * 2 + 1).sum(0)
    assert r.device == torch.device("tpu", 1)
    torch.testing.assert_close(r.cpu(), (a * 2 + 1).sum(0))
    assert torch.ones(3, device="tpu:1").device.index == 1
    assert torch.randn(3, device="tpu:1").device.index == 1
    assert torch.arange(4, device="tpu:1").device.index == 1
    assert torch.empty_strided((2, 2), (1, 2), device="tpu:1").device.index == 1
    nz = torch.tensor([0.0, 1.0, 2.0], device="tpu:1").nonzero()  # data-dependent: run at record time
    assert nz.device.index == 1 and nz.cpu().tolist() == [[1], [2]]


@two_chips
def test_cross_chip_copies():
    a = torch.randn(4, 5)
    t0 = a.to("tpu:0") * 2  # pending on chip 0
    t1 = t0.to("tpu:1")
    assert t1.device.index == 1
    torch.testing.assert_close(t1.cpu(), a * 2)
    back = (t1 + 1).to("tpu:0")
    assert back.device.index == 0
    torch.testing.assert_close(back.cpu(), a * 2 + 1)
    dst = torch.zeros(4, 5, device="tpu:1") + 1  # pending destination
    dst.copy_(t0)
    torch.testing.assert_close(dst.cpu(), a * 2)
    dst[:, 1].copy_(torch.ones(4, device="tpu:0") * 7)  # into a view, with a dtype kept
    expected = a * 2
    expected[:, 1] = 7
    torch.testing.assert_close(dst.cpu(), expected)
    half = torch.empty(4, 5, dtype=torch.float16, device="tpu:1")
    half.copy_(t0)  # with a dtype conversion
    torch.testing.assert_close(half.cpu(), (a * 2).half())


@two_chips
def test_mixing_chips_raises_cudas_error_and_leaves_both_usable():
    x = torch.ones(3, device="tpu:0")
    y = torch.ones(3, device="tpu:1")
    msg = "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and tpu:1!"
    with pytest.raises(RuntimeError, match=msg):
        x + y
    with pytest.raises(RuntimeError, match="tpu:1 and tpu:0!"):
        y.add_(x)
    with pytest.raises(RuntimeError, match="found at least two devices"):
        torch.cat([x, y])
    with pytest.raises(RuntimeError, match="tpu:1 and cpu!"):
        y + torch.ones(3)
    assert (x + x).sum().item() == 6 and (y + y).sum().item() == 6


def test_invalid_ordinal_raises_as_cuda():
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.empty(2, device=f"tpu:{N}")
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.ones(2, device=f"tpu:{N}")
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.ones(2).to(f"tpu:{N}")
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.tpu.set_device(N)
    with pytest.raises(RuntimeError):
        torch.accelerator.set_device_index(N)
    with pytest.raises(ValueError, match="Expected a tpu device"):
        torch.tpu.set_device("cpu")
    assert torch.tpu.current_device() == 0
    assert torch.ones(2, device="tpu").device.index == 0


@two_chips
def test_current_device_apis_agree():
    assert torch.tpu.current_device() == 0
    with torch.tpu.device(1):
        assert torch.tpu.current_device() == 1 == torch.accelerator.current_device_index()
        assert torch.ones(2, device="tpu").device.index == 1
        with torch.tpu.device(0):
            assert torch.accelerator.current_device_index() == 0
        assert torch.tpu.current_device() == 1
    assert torch.tpu.current_device() == 0
    torch.accelerator.set_device_index(1)
    try:
        assert torch.tpu.current_device() == 1
        assert torch.empty(1, device="tpu").device.index == 1
    finally:
        torch.tpu.set_device(0)
    with torch.accelerator.device_index(1):
        assert torch.tpu.current_device() == 1
    assert torch.tpu.current_device() == 0
    with pytest.raises(ZeroDivisionError):
        with torch.tpu.device(1):
            1 / 0
    assert torch.tpu.current_device() == 0
    with torch.tpu.device_of(torch.ones(1, device="tpu:1")):
        assert torch.tpu.current_device() == 1


@two_chips
def test_current_device_is_per_thread():
    seen = []
    torch.tpu.set_device(1)
    try:
        run_threads(lambda: seen.append(torch.tpu.current_device()))
    finally:
        torch.tpu.set_device(0)
    assert seen == [0]


@two_chips
def test_memory_accounting_per_chip():
    import gc

    gc.collect()
    m0, m1 = torch.tpu.memory_allocated(0), torch.tpu.memory_allocated(1)
    x = torch.empty(1000, device="tpu:1")
    assert torch.tpu.memory_allocated(1) == m1 + 4000
    assert torch.tpu.memory_allocated(0) == m0
    assert torch.accelerator.memory_allocated(1) == m1 + 4000
    del x
    assert torch.tpu.memory_allocated(1) == m1


@two_chips
def test_each_chip_has_its_generator():
    torch.manual_seed(5)  # seeds every chip (manual_seed_all)
    a0 = torch.rand(4, device="tpu:0").cpu()
    a1 = torch.rand(4, device="tpu:1").cpu()
    torch.testing.assert_close(a0, a1)  # same seed, same stream, as per-device CUDA generators
    g1 = torch.tpu.default_generators[1]
    off = g1.get_offset()
    torch.rand(4, device="tpu:1")
    assert g1.get_offset() > off
    off0 = torch.tpu.default_generators[0].get_offset()
    torch.rand(4, device="tpu:1")
    assert torch.tpu.default_generators[0].get_offset() == off0
    state = torch.tpu.get_rng_state(1)
    b = torch.rand(4, device="tpu:1").cpu()
    torch.tpu.set_rng_state(state, 1)
    torch.testing.assert_close(torch.rand(4, device="tpu:1").cpu(), b)


@two_chips
def test_each_chip_has_its_queue_and_clock():
    C = _C()
    torch.tpu.synchronize(0)
    torch.tpu.synchronize(1)
    t0 = C._chip_sim_time(0)
    x = torch.ones(256, 256, device="tpu:1")
    y = x @ x
    assert C._storage_has_pending(y)
    torch.tpu.synchronize(0)  # chip 0's queue only
    assert C._storage_has_pending(y)
    before1 = C._chip_sim_time(1)
    torch.tpu.synchronize(1)
    assert not C._storage_has_pending(y)
    assert C._chip_sim_time(1) > before1
    assert C._chip_sim_time(0) == t0
    assert y[0, 0].item() == 256


@two_chips
def test_training_step_on_chip_one():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref.load_state_dict(model.state_dict())
    model.to("tpu:1")
    assert all(p.device.index == 1 for p in model.parameters())
    x, target = torch.randn(4, 8), torch.randn(4, 2)
    for m, xx, tt in ((model, x.to("tpu:1"), target.to("tpu:1")), (ref, x, target)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        loss = torch.nn.functional.mse_loss(m(xx), tt)
        loss.backward()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.device.index == 1
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


@two_chips
def test_save_and_load_keep_the_chip(tmp_path):
    t = torch.arange(5.0, device="tpu:1")
    path = tmp_path / "t.pt"
    torch.save(t, path)
    u = torch.load(path)
    assert u.device.index == 1 and u.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    v = torch.load(path, map_location="tpu:0")
    assert v.device.index == 0


@two_chips
def test_set_device_initializes_as_cuda_so_devicemesh_and_faketensor_keep_the_chip():
    """torch.cuda.set_device and torch.accelerator.set_device_index initialize the device
    (is_initialized() True after them). torch relies on it: DeviceMesh picks
    rank % device_count() only when is_initialized() is False, and FakeTensor (DTensor's
    sharding propagation) resolves a device without index to the current one only when it
    is True, else to index 0. Before, rank 1 of PyTorch's test_dtensor.py
    test_modules_w_meta_dtensor raised "found at least two devices, tpu:1 and tpu:0"."""
    code = """
    import os, sys, tempfile, torch, torch_tpu_eager, torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    how = sys.argv[1]
    assert not torch.tpu.is_initialized()
    torch.tpu.set_device(1) if how == "tpu" else torch.accelerator.set_device_index(1)
    with FakeTensorMode():
        fake = torch.empty(2, device="tpu").device
    f = tempfile.mktemp()
    dist.init_process_group("cpu:gloo,tpu:tpu_ccl", init_method="file://" + f, rank=0, world_size=1)
    init_device_mesh("tpu", (1,))  # rank 0: would pick tpu:0 if the chip was not chosen
    print(torch.tpu.is_initialized(), fake, torch.tpu.current_device(), torch.empty(1, device="tpu").device)
    dist.destroy_process_group()
    """
    for how in ("tpu", "accelerator"):
        r = run_python(code.replace("sys.argv[1]", repr(how)), timeout=180)
        assert r.returncode == 0 and r.stdout.strip() == "True tpu:1 1 tpu:1", (how, r.stdout, r.stderr[-3000:])
