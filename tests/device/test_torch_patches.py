"""torch_tpu_eager._torch_patches is the only place that changes torch's objects.

- Each patched torch original still has the shape (signature or code) the patch
  was written for; a new torch fails here, naming the patch to re-check.
- No other module of the package assigns attributes of torch (an AST scan of
  the package source), so the table in _torch_patches stays complete.
"""

import ast
import pathlib

import pytest
import torch

import torch_tpu_eager
from torch_tpu_eager import _torch_patches

PACKAGE = pathlib.Path(torch_tpu_eager.__file__).parent


@pytest.mark.parametrize("target", sorted(_torch_patches.PATCHES))
def test_patched_original_has_the_expected_shape(target):
    entry = _torch_patches.PATCHES[target]
    try:
        got = _torch_patches.shape_of(_torch_patches.original(target))
    except (LookupError, AttributeError) as e:
        pytest.fail(f"torch patch {target}: the original is gone in torch {torch.__version__} ({e})")
    assert got == entry.expect, (
        f"torch patch {target} was checked against torch {entry.checked} where the original is "
        f"{entry.expect}; torch {torch.__version__} has {got}. Re-check the patch (why: {entry.why})"
    )


def test_every_patch_says_why_and_version():
    for target, entry in _torch_patches.PATCHES.items():
        assert entry.target == target and entry.why and entry.checked == "2.13.0"


def test_applied_patches_are_in_place_and_listed():
    # After `import torch_tpu_eager` each replaced attribute is our replacement,
    # tagged with its table entry, and the original is kept.
    assert set(_torch_patches._originals) <= set(_torch_patches.PATCHES)
    assert "torch._tensor_str._tensor_str" in _torch_patches._originals
    for target, orig in _torch_patches._originals.items():
        owner, attr = _torch_patches._resolve(target)
        current = getattr(owner, attr)
        assert target in getattr(current, "_tpu_eager_patches", ())
        assert current is not orig


def test_patch_refuses_unlisted_targets_and_is_idempotent():
    from torch import _tensor_str

    with pytest.raises(LookupError, match="not listed"):
        _torch_patches.patch(_tensor_str, "_Formatter", object, why="test")
    before = _tensor_str._tensor_str
    orig = _torch_patches.patch(_tensor_str, "_tensor_str", lambda self, indent: "", why="test")
    assert _tensor_str._tensor_str is before  # already patched: unchanged
    assert orig is _torch_patches.original("torch._tensor_str._tensor_str")


def test_shape_mismatch_warns_naming_the_patch(monkeypatch):
    class Owner:
        pass

    monkeypatch.setitem(
        _torch_patches.PATCHES,
        "fake.Owner.f",
        _torch_patches.TorchPatch("fake.Owner.f", "(x)", "test"),
    )
    monkeypatch.setattr(_torch_patches, "_target_name", lambda owner, attr: "fake.Owner.f")
    Owner.f = lambda x, y: None
    with pytest.warns(_torch_patches.TorchPatchWarning, match="fake.Owner.f"):
        _torch_patches.patch(Owner, "f", lambda x: None, why="test")
    _torch_patches._originals.pop("fake.Owner.f", None)
    _torch_patches._warned.discard("fake.Owner.f")


def test_inductor_redirect_forwards_config_patches():
    # torch 2.13's wrapper takes a keyword-only config_patches; the redirect passes
    # it through for graphs without "tpu" inputs.
    seen = {}

    def fake_call(self, model_, inputs_, *, config_patches=None):
        seen["config_patches"] = config_patches
        return "inductor"

    call = torch._TorchCompileInductorWrapper.__call__
    saved = _torch_patches._originals["torch._TorchCompileInductorWrapper.__call__"]
    # The redirect closes over the original it read at install; swap the cell's function.
    cell = [c for c in call.__closure__ if c.cell_contents is saved][0]
    cell.cell_contents = fake_call
    try:
        assert call(None, None, [torch.ones(1)], config_patches={"a": 1}) == "inductor"
    finally:
        cell.cell_contents = saved
    assert seen["config_patches"] == {"a": 1}


# ---- no other module patches torch ----


def _torch_names(tree):
    """Names bound to torch objects in a module: imports from torch and names
    assigned from an expression rooted in such a name (``cls = torch.Tensor``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.module and (node.module == "torch" or node.module.startswith("torch.")):
                for a in node.names:
                    names.add(a.asname or a.name)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _root(node.value) in names:
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id not in names:
                        names.add(t.id)
                        changed = True
    return names


def _root(expr):
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _torch_assignments(path, source=None):
    tree = ast.parse(source if source is not None else path.read_text(), filename=str(path))
    names = _torch_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Attribute) and _root(t) in names:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(t)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _root(node.args[0]) in names:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.meta_path":
            found.append(f"{path.name}:{node.lineno}: sys.meta_path")
    return found


def test_scan_finds_each_kind_of_torch_assignment():
    # A check of the checker, on a made-up module.
    source = (
        "import sys\nimport torch\nimport torch.utils.dlpack as dl\nfrom torch import _tensor_str as ts\n"
        "c = torch.Tensor\nd = c.__dlpack__\nmine = object()\n"
        "ts._tensor_str = 1\nc.x = 2\ntorch.y = 3\nsetattr(torch.nn, 'z', 4)\ndl.to_dlpack = 5\n"
        "torch.a.b += 1\nsys.meta_path.insert(0, None)\nmine.x = 6\nsetattr(mine, 'y', 7)\n"
    )
    found = _torch_assignments(pathlib.Path("made_up.py"), source)
    assert sorted(int(f.split(":")[1]) for f in found) == [8, 9, 10, 11, 12, 13, 14], found


def test_no_other_module_assigns_torch_attributes():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_torch_patches.py":
            continue
        found += _torch_assignments(path)
    assert not found, "torch is patched outside torch_tpu_eager/_torch_patches.py:\n" + "\n".join(found)
