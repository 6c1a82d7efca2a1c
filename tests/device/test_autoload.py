"""Autoload: the torch.backends entry point makes "tpu" available on `import torch` alone;
TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off (as PyTorch documents)."""

import os
import subprocess
import sys
import textwrap


from difftest import REPO_ROOT, requires_tpu

pytestmark = requires_tpu

ROOT = REPO_ROOT


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
