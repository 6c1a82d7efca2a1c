"""Both examples in short form: the device run must match the CPU run."""

import importlib.util
import os

import pytest

from difftest import QUICK_EXAMPLE_ARGS, REPO_ROOT, requires_tpu

EXAMPLES = os.path.join(REPO_ROOT, "examples")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@requires_tpu
def test_train_digits_quick_matches_cpu():
    pytest.importorskip("sklearn", reason="the digits data ships with scikit-learn (examples extra)")
    assert _load("train_digits").main(list(QUICK_EXAMPLE_ARGS)) == 0


@requires_tpu
def test_train_char_lm_quick_matches_cpu():
    assert _load("train_char_lm").main(list(QUICK_EXAMPLE_ARGS)) == 0
