"""Shared pytest configuration: chooses the device under test.

The suite runs against the "tpu" device by default. Setting the environment variable
``TPU_TEST_DEVICE=cpu`` runs every test against plain CPU PyTorch instead, which checks
that the tests themselves encode CPU semantics before the device exists.
"""
import math  # noqa: F401  (kept for tests that copy acceptance snippets verbatim)
import os
import sys

import pytest
import torch  # noqa: F401

# Make the helper module importable regardless of pytest's import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from difftest import DEVICE  # noqa: E402

if DEVICE == "tpu":
    import torch_tpu_eager  # noqa: F401,E402  (registers the "tpu" device)


@pytest.fixture(params=[DEVICE])
def dev(request):
    """The device string under test: "tpu", or "cpu" when TPU_TEST_DEVICE=cpu."""
    return request.param


@pytest.fixture
def spyre_target():
    """Makes "spyre" the active target for one test, then restores the previous one.
    Yields the torch_tpu_eager module."""
    import torch_tpu_eager as tte

    before = tte.get_target()
    tte.set_target("spyre")
    try:
        yield tte
    finally:
        tte.set_target(before)


@pytest.fixture
def restore_target_and_precision():
    """Restores the active target and float32 matmul precision after a test."""
    import torch_tpu_eager as tte

    target, precision = tte.get_target(), torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)
    tte.set_target(target)
