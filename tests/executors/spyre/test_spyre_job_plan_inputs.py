"""Spyre job plan: host-to-device steps only for values the flush did not create."""

import torch
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


def test_spyre_job_plan_has_no_h2d_for_values_the_flush_creates(spyre_target):
    from torch_tpu_eager import spyre

    # Every value of this flush is created on the device (zero_, then add):
    # docs/spyre.md: H2D only for "a value the flush has not written".
    (torch.zeros(64, 32, device="tpu") + 1).cpu()
    steps = spyre.job_plan()["steps"]
    assert [s for s in steps if s["kind"] == "H2D"] == []
