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
