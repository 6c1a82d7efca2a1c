"""Train an MLP on the UCI handwritten digits, on the device and on CPU, and compare.

The 1,797 8x8 images ship with scikit-learn (no download). The same program runs twice
from the same seed: once on ``--device`` (default "tpu") and once on "cpu". Both runs start
from identical weights (the model is built on CPU and moved) and see identical batches
(shuffled by a CPU generator), so their per-epoch losses must agree to 1e-4 relative.

The loss and accuracy counts stay on the device during an epoch and are read to the host
once per epoch, so the device has whole training steps to defer and fuse.

    python examples/train_digits.py                 # tpu vs cpu, 12 epochs
    python examples/train_digits.py --device cpu    # cpu vs cpu (sanity run)
    python examples/train_digits.py --quick         # 3 epochs, for tests
"""

import argparse
import sys
import time
from pathlib import Path

import torch

try:
    import torch_tpu_eager  # registers the "tpu" device and torch.tpu

    _IMPORT_ERROR = None
except ImportError as exc:  # a --device cpu run must work without the extension
    torch_tpu_eager = None
    _IMPORT_ERROR = exc

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find _common however we are loaded
from _common import (  # noqa: E402
    device_metrics,
    print_fusion_metrics,
    quick_default,
    rel_diff,
    require_device,
    reset_device_metrics,
)

SEED = 0
BATCH_SIZE = 64
LR = 3e-3
LOSS_RTOL = 1e-4
FULL_EPOCHS = 12
QUICK_EPOCHS = 3
FULL_MIN_ACC = 0.90
# After 3 epochs this model is at about 0.93 on CPU; the quick run only has to show that it learns.
QUICK_MIN_ACC = 0.85


def load_data(seed=SEED):
    """Return (x_train, y_train, x_test, y_test) as CPU tensors; a fixed 80/20 split, pixels/16."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = len(x) // 5
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model():
    """The 64-128-64-10 ReLU MLP, built on CPU from the global seed."""
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def train(device, epochs, data, seed=SEED):
    """Train one model on ``device``; return a list of per-epoch dicts (loss, train_acc, test_acc)."""
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(seed)
    model = make_model().to(device)  # identical initial weights on every device
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(seed + 1)  # CPU generator: same batches everywhere
    x_test_d, y_test_d = x_test.to(device), y_test.to(device)
    n_train = len(x_train)

    history = []
    for _ in range(epochs):
        model.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        order = torch.randperm(n_train, generator=shuffle)
        for start in range(0, n_train, BATCH_SIZE):
            idx = order[start : start + BATCH_SIZE]
            xb, yb = x_train[idx].to(device), y_train[idx].to(device)
            logits = model(xb)
            loss = loss_fn(logits, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Accumulate on the device; nothing is read back inside the epoch.
            loss_sum += loss.detach() * len(idx)
            correct += (logits.detach().argmax(dim=1) == yb).sum()

        model.eval()
        with torch.no_grad():
            test_correct = (model(x_test_d).argmax(dim=1) == y_test_d).sum()
        # One host read per epoch for all three numbers.
        stats = torch.stack([loss_sum, correct.to(torch.float32), test_correct.to(torch.float32)])
        loss_total, n_correct, n_test_correct = stats.cpu().tolist()
        history.append(
            {
                "loss": loss_total / n_train,
                "train_acc": n_correct / n_train,
                "test_acc": n_test_correct / len(x_test),
            }
        )
    return history


def main(argv=None):
    """Run the device/CPU comparison; return 0 on PASS and 1 on FAIL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="tpu", help='device to test against CPU (default "tpu")')
    parser.add_argument("--epochs", type=int, default=None, help=f"epochs (default {FULL_EPOCHS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        default=quick_default(),
        help=f"{QUICK_EPOCHS} epochs and a relaxed accuracy bar (for tests)",
    )
    args = parser.parse_args(argv)
    epochs = args.epochs if args.epochs is not None else (QUICK_EPOCHS if args.quick else FULL_EPOCHS)
    min_acc = QUICK_MIN_ACC if args.quick else FULL_MIN_ACC
    if epochs < 1:
        parser.error("--epochs must be at least 1")
    require_device(args.device, torch_tpu_eager, _IMPORT_ERROR)

    # Stated, not assumed: the device's matmul precision follows this setting, and the
    # 1e-4 agreement with CPU is only expected at full f32.
    torch.set_float32_matmul_precision("highest")
    data = load_data()
    print(
        f"digits: {len(data[0])} train / {len(data[2])} test images, {epochs} epochs, "
        f"batch {BATCH_SIZE}, device {args.device!r} vs 'cpu'"
    )

    # CPU first, so that PyTorch's one-time start-up cost is not billed to the device run.
    t0 = time.perf_counter()
    cpu_hist = train("cpu", epochs, data)
    t_cpu = time.perf_counter() - t0

    reset_device_metrics(args.device, torch_tpu_eager)
    t0 = time.perf_counter()
    dev_hist = train(args.device, epochs, data)
    t_dev = time.perf_counter() - t0
    metrics = device_metrics(args.device, torch_tpu_eager)

    dev = args.device
    print(
        f"{'epoch':>5} | {'loss ' + dev:>12} {'loss cpu':>10} {'rel diff':>9} | "
        f"{'train ' + dev:>10} {'train cpu':>9} | {'test ' + dev:>9} {'test cpu':>8}"
    )
    worst = 0.0
    for epoch, (d, c) in enumerate(zip(dev_hist, cpu_hist), 1):
        diff = rel_diff(d["loss"], c["loss"])
        worst = max(worst, diff)
        print(
            f"{epoch:>5} | {d['loss']:>12.6f} {c['loss']:>10.6f} {diff:>9.2e} | "
            f"{d['train_acc']:>10.4f} {c['train_acc']:>9.4f} | "
            f"{d['test_acc']:>9.4f} {c['test_acc']:>8.4f}"
        )
    print(f"time: {dev} {t_dev:.2f} s, cpu {t_cpu:.2f} s")
    n_steps = epochs * -(-len(data[0]) // BATCH_SIZE)
    print_fusion_metrics(metrics, n_steps)

    failures = []
    final_acc = dev_hist[-1]["test_acc"]
    if not final_acc >= min_acc:
        failures.append(f"test accuracy {final_acc:.4f} < {min_acc}")
    if not worst <= LOSS_RTOL:
        failures.append(f"loss differs from CPU by {worst:.2e} relative (> {LOSS_RTOL:g})")
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print(f"PASS: test accuracy {final_acc:.4f} >= {min_acc}, max loss rel diff vs CPU {worst:.2e} <= {LOSS_RTOL:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
