"""benchmarks/llama_step.py's 2-layer llama training step on "tpu" against CPU: the loss
and all 21 gradients after one warm step (transformers is optional: skipped without it)."""

import copy
import os
import sys

import pytest
import torch

from difftest import DEVICE, REPO_ROOT, aten_ops_during

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


@pytest.mark.skipif(DEVICE != "tpu", reason="fused loops are the tpu executor's")
def test_llama_step_silu_backward_in_fused_loops():
    """The MLP's two silu_backward run inside the down-projection gradient's matmul epilogue
    loops (Fn::kSiluBwd), not through CPU's kernel; the gradients they feed equal CPU's."""
    import torch_tpu_eager

    cpu_model, ids = llama_step.build()
    dev_model = copy.deepcopy(cpu_model).to("tpu")
    ids_dev = ids.to("tpu")

    def record(model, x):
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        return loss

    for _ in range(2):
        record(dev_model, ids_dev)
        torch.tpu.synchronize()
    record(cpu_model, ids)
    record(dev_model, ids_dev)  # warm: every region a cache hit
    host_ops = aten_ops_during(torch.tpu.synchronize)
    assert "aten::silu_backward" not in host_ops
    with torch_tpu_eager.profile() as prof:  # the kernels of work recorded inside the block
        record(dev_model, ids_dev)
        torch.tpu.synchronize()
    fused = [k["name"] for k in prof.kernels if "silu_backward" in k["ops"]]
    assert len(fused) == 2 and all(name.startswith("fused_") for name in fused), fused
    for (name, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        if "gate_proj" in name:  # the gradient silu_backward feeds
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6, msg=name)
