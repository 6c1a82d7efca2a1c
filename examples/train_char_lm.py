"""Train a small character-level transformer language model on the device and on CPU.

A GPT-style decoder written from scratch: token + position embeddings, pre-LayerNorm
blocks of causal self-attention (one fused QKV projection, a registered lower-triangular
mask) and a GELU MLP, a final LayerNorm and an output head whose weight is tied to the
token embedding. It is trained with AdamW (weight decay) and gradient-norm clipping on the
text of Python's own help topics (``pydoc_data.topics``, part of the standard library).

The same program runs on ``--device`` (default "tpu") and on "cpu" from the same seed with
the same batches (sampled by a CPU generator); the losses must agree to 1e-3 relative.
Finally the device model writes 200 characters.

    python examples/train_char_lm.py                 # tpu vs cpu, 200 steps
    python examples/train_char_lm.py --device cpu    # cpu vs cpu (sanity run)
    python examples/train_char_lm.py --quick         # 20 steps, for tests
"""

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

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
BATCH_SIZE = 16
LR = 3e-3
WEIGHT_DECAY = 0.1
LOG_EVERY = 20
FULL_STEPS = 200
QUICK_STEPS = 20
LOSS_RTOL = 1e-3
# The loss starts near ln(vocab) ~ 4.6. After 200 steps single-batch losses are 2.0-2.8 on
# CPU (they swing by ~0.3 from batch to batch), so a drop of 0.5 leaves a wide margin while
# still failing a model that does not learn; 20 steps reach about 3.1.
FULL_MIN_DROP = 0.5
QUICK_MIN_DROP = 0.3
SAMPLE_CHARS = 200


@dataclass
class Config:
    """Model size; small enough that 200 steps take seconds on a CPU."""

    vocab_size: int
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0  # p=0: the device RNG need not match CPU's


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t only sees positions <= t."""

    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k and v in one matmul
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        # A buffer, so it moves with .to(device) and is not trained.
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size))
        self.register_buffer("tril", mask.view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, heads, T, head size): a view and a transpose, no copy
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.tril[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Decoder-only character language model with the output head tied to the token embedding."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying: one Parameter, two uses
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        # Small normal init keeps the initial loss near ln(vocab).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        """Return logits (B, T, vocab) and, when ``targets`` is given, the mean cross-entropy."""
        B, T = idx.shape
        assert T <= self.cfg.block_size
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss


def load_text():
    """Return (data, itos): the help-topics text as an int64 CPU tensor and the vocabulary."""
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    itos = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(itos)}
    data = torch.tensor([stoi[ch] for ch in text], dtype=torch.int64)
    return data, itos


def get_batch(data, block_size, gen):
    """Sample BATCH_SIZE random windows (inputs, next-char targets) on CPU from ``gen``."""
    starts = torch.randint(len(data) - block_size - 1, (BATCH_SIZE,), generator=gen)
    x = torch.stack([data[s : s + block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts.tolist()])
    return x, y


def make_optimizer(model):
    """AdamW with weight decay on matrices and embeddings only, not on biases or LayerNorm."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99))


def build_model(device, vocab_size, seed=SEED):
    """Build the model on CPU from ``seed`` and move it; the tied weight must stay tied."""
    torch.manual_seed(seed)
    model = CharTransformer(Config(vocab_size=vocab_size)).to(device)
    # .to() must keep one shared Parameter, or the head silently trains separately.
    assert model.lm_head.weight is model.tok_emb.weight, "weight tying lost in .to(device)"
    return model


def train(device, steps, data, vocab_size, seed=SEED):
    """Train on ``device``; return (model, {step: loss}) with the loss read every LOG_EVERY steps.

    The loss at step s is the training-batch loss after s updates, so step 0 is the
    untrained model and step ``steps`` the trained one.
    """
    model = build_model(device, vocab_size, seed)
    opt = make_optimizer(model)
    gen = torch.Generator().manual_seed(seed + 1)  # CPU generator: same batches everywhere
    block_size = model.cfg.block_size
    losses = {}
    model.train()
    for step in range(steps + 1):
        x, y = get_batch(data, block_size, gen)
        _, loss = model(x.to(device), y.to(device))
        if step % LOG_EVERY == 0 or step == steps:
            losses[step] = loss.item()  # the only host read in the loop
        if step == steps:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return model, losses


@torch.no_grad()
def sample(model, itos, n_chars, prompt="\n", seed=SEED):
    """Generate ``n_chars`` characters; logits come from the model's device, the draw is on CPU."""
    model.eval()
    stoi = {ch: i for i, ch in enumerate(itos)}
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed + 2)
    tokens = [stoi[ch] for ch in prompt]
    for _ in range(n_chars):
        idx = torch.tensor([tokens[-model.cfg.block_size :]], device="cpu").to(device)
        logits, _ = model(idx)
        probs = F.softmax(logits[0, -1], dim=-1).cpu()
        tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
    return "".join(itos[t] for t in tokens[len(prompt) :])


def main(argv=None):
    """Run the device/CPU comparison and sampling; return 0 on PASS and 1 on FAIL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="tpu", help='device to test against CPU (default "tpu")')
    parser.add_argument("--steps", type=int, default=None, help=f"training steps (default {FULL_STEPS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        default=quick_default(),
        help=f"{QUICK_STEPS} steps and a smaller required loss drop (for tests)",
    )
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else FULL_STEPS)
    min_drop = QUICK_MIN_DROP if args.quick else FULL_MIN_DROP
    if steps < 1:
        parser.error("--steps must be at least 1")
    require_device(args.device, torch_tpu_eager, _IMPORT_ERROR)

    # The 1e-3 agreement with CPU is only expected with f32 matmuls on the device.
    torch.set_float32_matmul_precision("highest")
    data, itos = load_text()
    dev = args.device
    print(
        f"text: {len(data)} characters, vocabulary {len(itos)}, {steps} steps, "
        f"batch {BATCH_SIZE}, device {dev!r} vs 'cpu'"
    )

    # CPU first, so that PyTorch's one-time start-up cost is not billed to the device run.
    t0 = time.perf_counter()
    _, cpu_losses = train("cpu", steps, data, len(itos))
    t_cpu = time.perf_counter() - t0

    reset_device_metrics(dev, torch_tpu_eager)
    t0 = time.perf_counter()
    model, dev_losses = train(dev, steps, data, len(itos))
    t_dev = time.perf_counter() - t0
    metrics = device_metrics(dev, torch_tpu_eager)

    print(f"{'step':>5} | {'loss ' + dev:>10} {'loss cpu':>9} {'rel diff':>9}")
    for step in sorted(dev_losses):
        d, c = dev_losses[step], cpu_losses[step]
        print(f"{step:>5} | {d:>10.5f} {c:>9.5f} {rel_diff(d, c):>9.2e}")
    print(f"time: {dev} {t_dev:.2f} s, cpu {t_cpu:.2f} s")
    print_fusion_metrics(metrics, steps)

    t0 = time.perf_counter()
    text = sample(model, itos, SAMPLE_CHARS)
    print(f"sample from the {dev} model ({time.perf_counter() - t0:.2f} s):")
    print("-" * 60)
    print(text)
    print("-" * 60)

    failures = []
    first, last = dev_losses[0], dev_losses[steps]
    if not last < first - min_drop:
        failures.append(f"loss fell from {first:.4f} to {last:.4f}, less than {min_drop}")
    final_diff = rel_diff(last, cpu_losses[steps])
    if not final_diff <= LOSS_RTOL:
        failures.append(f"final loss differs from CPU by {final_diff:.2e} relative (> {LOSS_RTOL:g})")
    if len(text) != SAMPLE_CHARS:
        failures.append(f"sampled {len(text)} characters, expected {SAMPLE_CHARS}")
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print(
        f"PASS: loss {first:.4f} -> {last:.4f} (drop > {min_drop}), "
        f"final loss rel diff vs CPU {final_diff:.2e} <= {LOSS_RTOL:g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
