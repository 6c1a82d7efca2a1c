"""KTIR as an IR (issue 21): the printed tile program parses back to the same
text, passes the verifier, and a dumped file edited by hand runs with
spyre.run_ktir under Spyre's df16 numerics. Bad programs raise ValueError
naming the line and the rule."""

import re

import pytest
import torch

from difftest import requires_tpu
from test_spyre_numerics import df16_ref, matmul_ref, same, store

pytestmark = requires_tpu


def _programs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 256, generator=g).half()
    w = torch.randn(256, 64, generator=g).half()
    a, b = torch.randn(66, 32, generator=g), torch.randn(16, 32, generator=g)

    def p16():
        d, dw = x.to("tpu"), w.to("tpu")
        y = torch.nn.functional.gelu(d * 2 + d, approximate="tanh")
        z = torch.nn.functional.layer_norm(y, (256,), None, None, 1e-5)
        s = torch.softmax(z @ dw, -1).sum(dim=0, keepdim=True)
        m = z[:, 3:40:2].t().amax(dim=1).to(torch.float32).mean()
        return s, m

    def p32():
        c = a.to("tpu")[1:65] @ b.to("tpu").t()
        c.add_(1.5)
        i = torch.tensor([3, 0, 5]).to("tpu")
        return torch.cat([c[i], c[:2]]).relu().sum(dim=1), (c > 0).sum()

    def pbf():
        t = x.to(torch.bfloat16).to("tpu")
        return torch.sigmoid(t).mean(dim=1), torch.tanh(t).amax()

    return [p16, p32, pbf]


@pytest.mark.parametrize("prog", range(3))
def test_every_region_round_trips_and_verifies(spyre_target, prog):
    from torch_tpu_eager import spyre

    fn = _programs()[prog]
    texts = []
    for out in fn():
        out.cpu()
        texts += [t for t in spyre.dump_ktir().split("\n\n") if t]
    assert texts
    for t in texts:
        t = t if t.endswith("\n") else t + "\n"
        assert spyre.format_ktir(t) == t
        spyre.verify_ktir(t)


def _dump_one(tmp_path, monkeypatch, fn):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    fn()
    files = sorted(tmp_path.glob("*.ktir"))
    assert len(files) == 1, files
    return files[0]


def test_dump_dir_is_made_or_warned(spyre_target, tmp_path, monkeypatch):
    # A kernel author's TORCH_TPU_DUMP_DIR that does not exist yet is made (with its
    # parents); one that cannot be made warns (once) instead of dropping every
    # program silently, and the run goes on.
    x = torch.randn(4, 64)
    nested = tmp_path / "a" / "b"
    path = _dump_one(nested, monkeypatch, lambda: (x.to("tpu") * 3).cpu())
    assert path.parent == nested
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(blocker / "d"))
    with pytest.warns(UserWarning, match="TORCH_TPU_DUMP_DIR=.* is not usable"):
        got = (x.to("tpu").exp() - 2).cpu()  # a new region: compiled, so dumped
    assert got.shape == x.shape and not list(blocker.parent.glob("**/*.ktir"))[1:]


def test_edited_dump_runs_with_df16_numerics(spyre_target, tmp_path, monkeypatch):
    from torch_tpu_eager import spyre

    g = torch.Generator().manual_seed(1)
    a = df16_ref(torch.randn(64, 128, generator=g)).half()
    b = df16_ref(torch.randn(64, 128, generator=g)).half()
    path = _dump_one(tmp_path, monkeypatch, lambda: (a.to("tpu") * b.to("tpu")).cpu())
    text = path.read_text()
    assert "mul.Tensor(%0, %1)" in text
    (out,) = spyre.run_ktir(path, a, b)
    assert same(out.view(64, 128), store(a.float() * b.float(), torch.float16)) == 0
    # The kernel author's edit: a * b -> tanh(a - b) through an LX temporary.
    lines = text.splitlines()
    edited = []
    for ln in lines:
        if ln.startswith("  %2 = view HBM"):
            edited.append(ln.replace("%2 = view HBM df16(f16) %a2", "%3 = view HBM df16(f16) %a2"))
            edited.insert(len(edited) - 1, "  %2 = view LX df16(f16) %t0 offset=0 sizes=[64, 128] strides=[128, 1]")
        elif ln.startswith("  tile %2"):
            edited += [ln, ln.replace("tile %2", "tile %3")]
        elif "mul.Tensor" in ln:
            edited += ["  %2 = sub.Tensor(%0, %1, 1)", "  %3 = tanh(%2)"]
        else:
            edited.append(ln)
    path.write_text("\n".join(edited) + "\n")
    (out,) = spyre.run_ktir(path, a, b)
    want = store(torch.tanh(store(a.float() - b.float(), torch.float16).float()), torch.float16)
    assert same(out.view(64, 128), want) == 0
    # Tensors on the device work too.
    (out_d,) = spyre.run_ktir(path, a.to("tpu"), b.to("tpu"))
    assert out_d.device.type == "tpu" and torch.equal(out_d.cpu(), out)


def test_dumped_matmul_runs_as_on_the_device(spyre_target, tmp_path, monkeypatch):
    from torch_tpu_eager import spyre

    g = torch.Generator().manual_seed(2)
    a = df16_ref(torch.randn(32, 96, generator=g)).half()
    w = df16_ref(torch.randn(96, 40, generator=g)).half()
    got = {}
    path = _dump_one(tmp_path, monkeypatch, lambda: got.setdefault("c", (a.to("tpu") @ w.to("tpu")).cpu()))
    (out,) = spyre.run_ktir(path, a, w)
    assert torch.equal(out.view(32, 40), got["c"])
    assert same(got["c"], store(matmul_ref(a, w), torch.float16)) == 0


BASE = """ktir.kernel @k grid=[32] split=dim0 rows_per_core=1 cores_used=4 {
  %a0 = arg in f32 elems=256
  %a1 = arg out f32 elems=256
  %0 = view HBM f32 %a0 offset=0 sizes=[4, 64] strides=[64, 1]
  %1 = view LX f32 %t0 offset=0 sizes=[4, 64] strides=[64, 1]
  %2 = view HBM f32 %a1 offset=0 sizes=[4, 64] strides=[64, 1]
  tile %0 sizes=[1, 64] at=[core*1, 0]
  tile %1 sizes=[1, 64] at=[core*1, 0]
  tile %2 sizes=[1, 64] at=[core*1, 0]
  %1 = exp(%0)
  %2 = mul.Tensor(%1, 0.5)
}
"""


def test_base_program_is_valid_and_runs(spyre_target, tmp_path):
    from torch_tpu_eager import spyre

    assert spyre.format_ktir(BASE) == BASE
    spyre.verify_ktir(BASE)
    p = tmp_path / "k.ktir"
    p.write_text(BASE)
    x = torch.randn(256)
    (out,) = spyre.run_ktir(p, x)
    assert torch.equal(out, torch.exp(x) * 0.5)


def test_edited_address_arithmetic_is_what_runs(spyre_target, tmp_path):
    # The walk reads the views' offsets and strides as the text gives them:
    # the input view moved by one row (offset 64, 3 rows) and a row stride of
    # 0 (every core reads row 0) each give the values of those addresses.
    from torch_tpu_eager import spyre

    x = torch.randn(256)
    rows = x.view(4, 64)
    shifted = BASE.replace("cores_used=4", "cores_used=3").replace(
        "%a0 offset=0 sizes=[4, 64]", "%a0 offset=64 sizes=[3, 64]"
    )
    shifted = shifted.replace("%t0 offset=0 sizes=[4, 64]", "%t0 offset=0 sizes=[3, 64]")
    shifted = shifted.replace("%a1 offset=0 sizes=[4, 64]", "%a1 offset=0 sizes=[3, 64]")
    p = tmp_path / "shifted.ktir"
    p.write_text(shifted)
    (out,) = spyre.run_ktir(p, x)
    assert torch.equal(out.view(4, 64)[:3], torch.exp(rows[1:]) * 0.5)
    assert torch.equal(out.view(4, 64)[3], torch.zeros(64))  # never written
    broadcast = BASE.replace("%a0 offset=0 sizes=[4, 64] strides=[64, 1]", "%a0 offset=0 sizes=[4, 64] strides=[0, 1]")
    p = tmp_path / "broadcast.ktir"
    p.write_text(broadcast)
    (out,) = spyre.run_ktir(p, x)
    assert torch.equal(out.view(4, 64), (torch.exp(rows[0]) * 0.5).expand(4, 64))


BAD = [
    ("sizes=[4, 64] strides=[64, 1]\n  %1", "sizes=[4, 65] strides=[64, 1]\n  %1", 4, "view-bounds"),
    ("%a0 offset=0", "%a0 offset=200", 4, "view-bounds"),
    ("tile %0 sizes=[1, 64]", "tile %0 sizes=[1, 10]", 7, "stick"),
    ("tile %1 sizes=[1, 64] at=[core*1, 0]", "tile %1 sizes=[2, 64] at=[core*2, 0]", 8, "grid"),
    ("grid=[32]", "grid=[64]", 1, "grid"),
    ("cores_used=4", "cores_used=3", 7, "grid"),
    ("%1 = exp(%0)", "%1 = expo(%0)", 10, "op"),
    ("%1 = exp(%0)", "%1 = exp(%2)", 10, "def-use"),
    ("%2 = mul.Tensor(%1, 0.5)", "%2 = gt.Scalar(%1, 0.5)", 11, "types"),
    ("%2 = mul.Tensor(%1, 0.5)", "%2 = sum.dim_IntList(%1, [1], False, None)", 11, "types"),
    ("%2 = mul.Tensor(%1, 0.5)", '%2 = mul.Tensor(%1, "x")', 11, "types"),
    ("view LX f32", "view LX f17", 5, "types"),
    ("%a1 = arg out f32", "%a1 = arg out df16(f16)", 6, "view-bounds"),  # f32 view of 2-byte elements
    ("%a1 = arg out f32", "%a1 = arg out f16", 3, "types"),
    ("%1 = exp(%0)", "%1 = exp(%0", 10, "syntax"),
    ("  %2 = mul", "  tile %2 sizes=[1, 64] at=[core*1, 0]\n  %2 = mul", 11, "tile"),
    # Checks CPU's kernel makes (its C++ meta function) that the Python meta
    # kernel skips (_softmax's dim) or raises as a Python error (mm's shapes).
    ("%2 = mul.Tensor(%1, 0.5)", "%2 = _softmax(%1, 2, False)", 11, "types"),
    ("%2 = mul.Tensor(%1, 0.5)", "%2 = mm(%1, %1)", 11, "types"),
    # A written view whose elements share addresses (CPU refuses to write one).
    ("%a1 offset=0 sizes=[4, 64] strides=[64, 1]", "%a1 offset=0 sizes=[4, 64] strides=[0, 1]", 11, "view"),
    ("%t0 offset=0 sizes=[4, 64] strides=[64, 1]", "%t0 offset=0 sizes=[4, 64] strides=[64, 0]", 10, "view"),
    # An op writing an `in` argument (run_ktir would write the caller's tensor).
    ("%2 = mul.Tensor(%1, 0.5)", "%2 = mul.Tensor(%1, 0.5)\n  add_.Tensor(%0, %1)", 12, "arg"),
    ("%1 = exp(%0)", "exp_(%0)\n  %1 = exp(%0)", 10, "arg"),
]


@pytest.mark.parametrize("old,new,line,rule", BAD, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_verifier_names_line_and_rule(spyre_target, old, new, line, rule):
    from torch_tpu_eager import spyre

    assert old in BASE
    text = BASE.replace(old, new, 1)
    with pytest.raises(ValueError, match=rf"KTIR line {line}: rule '{re.escape(rule)}'"):
        spyre.verify_ktir(text)


def test_lx_capacity_and_bound_tensors(spyre_target, tmp_path):
    from torch_tpu_eager import spyre

    n = 2100  # one 128-byte stick per view, double buffered, exceeds 512 KB of LX
    views = "".join(f"  %{i} = view LX f32 %t{i} offset=0 sizes=[4] strides=[1]\n" for i in range(n))
    tiles = "".join(f"  tile %{i} sizes=[4] at=[0]\n" for i in range(n))
    text = "ktir.kernel @big grid=[32] split=dim0 rows_per_core=1 cores_used=1 {\n" + views + tiles + "}\n"
    with pytest.raises(ValueError, match="KTIR line 1: rule 'lx-capacity'"):
        spyre.verify_ktir(text)
    p = tmp_path / "k.ktir"
    p.write_text(BASE)
    with pytest.raises(ValueError, match="rule 'view-bounds'"):
        spyre.run_ktir(p, torch.randn(100))
    with pytest.raises(ValueError, match="rule 'types'"):
        spyre.run_ktir(p, torch.randn(256).half())
    with pytest.raises(ValueError, match="takes 1 input"):
        spyre.run_ktir(p)
    # A negative elems on an out argument (whose allocation it sizes) is the
    # verifier's error too, not the allocator's.
    p.write_text(BASE.replace("%a1 = arg out f32 elems=256", "%a1 = arg out f32 elems=-5"))
    with pytest.raises(ValueError, match="KTIR line 3: rule 'arg'"):
        spyre.run_ktir(p, torch.randn(256))
