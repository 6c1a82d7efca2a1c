"""Two models trained at once on two simulated chips, each on its own stream, timed
with events in simulated device time.

Model A (an MLP) trains on tpu:0 and model B (a wider MLP) on tpu:1, each on a
non-default stream of its chip; the steps of the two are interleaved by the host
program. Events recorded around each step measure the simulated device time of
that step's kernels on its chip (``Event.elapsed_time``, milliseconds), which the
script compares with the chips' own simulated clocks and prints per epoch.

    python examples/two_chips.py [--steps 20]

Needs TORCH_TPU_NUM_DEVICES >= 2 (the default is 2).
"""

import argparse

import torch

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device; `import torch` alone does when installed)


def make_model(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, 10),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if torch.tpu.device_count() < 2:
        raise SystemExit("needs two chips: TORCH_TPU_NUM_DEVICES=2")

    torch.manual_seed(0)
    xs = torch.randn(args.steps, 128, 64)
    ys = torch.randint(0, 10, (args.steps, 128))
    jobs = []
    for chip, width in ((0, 256), (1, 1024)):
        model = make_model(width).to(f"tpu:{chip}")
        jobs.append(
            {
                "chip": chip,
                "name": f"MLP(width={width}) on tpu:{chip}",
                "model": model,
                "opt": torch.optim.AdamW(model.parameters(), lr=1e-3),
                "stream": torch.tpu.Stream(chip),
                "x": xs.to(f"tpu:{chip}"),
                "y": ys.to(f"tpu:{chip}"),
                "ms": [],
                "losses": [],
            }
        )

    for step in range(args.steps):
        for job in jobs:  # interleaved: chip 0's step, then chip 1's
            with torch.tpu.stream(job["stream"]):
                start = torch.tpu.Event(enable_timing=True)
                end = torch.tpu.Event(enable_timing=True)
                start.record()
                logits = job["model"](job["x"][step])
                loss = torch.nn.functional.cross_entropy(logits, job["y"][step])
                job["opt"].zero_grad(set_to_none=True)
                loss.backward()
                job["opt"].step()
                end.record()
                job["losses"].append(loss.detach())
                job["pending"] = (start, end)
        for job in jobs:
            start, end = job.pop("pending")
            job["ms"].append(start.elapsed_time(end))

    for job in jobs:
        losses = [loss.item() for loss in job["losses"]]
        ms = job["ms"]
        print(
            f"{job['name']}: loss {losses[0]:.3f} -> {losses[-1]:.3f}; simulated step time "
            f"{sum(ms) / len(ms):.4f} ms (first {ms[0]:.4f} ms, total {sum(ms):.3f} ms)"
        )
    a, b = (sum(job["ms"]) for job in jobs)
    print(
        f"simulated time ratio tpu:1 / tpu:0 = {b / a:.2f} (its hidden layer has {(1024 / 256) ** 2:.0f}x the "
        "FLOPs; at batch 128 launches and HBM traffic take much of each step)"
    )
    return jobs


if __name__ == "__main__":
    main()
