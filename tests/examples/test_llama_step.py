"""benchmarks/llama_step.py's 2-layer llama training step on "tpu" against CPU: the loss
and all 21 gradients after one warm step (transformers is optional: skipped without it)."""

import copy
import os
import sys

import pytest
import torch

from difftest import REPO_ROOT

pytest.importorskip("transformers", reason="the llama step needs transformers (not a dependency of the package)")
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import llama_step  # noqa: E402


def test_llama_step_loss_and_gradients_match_cpu(dev):
    cpu_model, ids = llama_step.build()
    dev_model = copy.deepcopy(cpu_model).to(dev)
    sync = torch.tpu.synchronize if dev == "tpu" else (lambda: None)
    steps = [llama_step.make_step(cpu_model, ids, lambda: None), llama_step.make_step(dev_model, ids.to(dev), sync)]
    for _ in range(2):  # the second step is a warm one (its flush a cache hit on "tpu")
        cpu_loss, dev_loss = (step() for step in steps)
    # The loss is bit for bit CPU's; the gradients within the rounding of the matmuls'
    # summation order (CPU's GEMM on operands laid out as recorded).
    assert torch.equal(dev_loss.cpu(), cpu_loss)
    params = list(zip(cpu_model.named_parameters(), dev_model.parameters()))
    assert len(params) == 21
    for (name, p), q in params:
        assert q.grad is not None and q.grad.device.type == dev, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6, msg=name)
