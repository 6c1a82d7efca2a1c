"""The op table (csrc/ops/op_table.inc) is what tools/gen_op_table.py generates, and
its per-op traits are consistent with csrc/ops/op_table.h.

Per-op knowledge of the record kernel lives in the table's traits column (generated
from OP_TRAITS / CALL_CHECKS), not in op-name comparisons in csrc/ops: these tests
catch a stale table after the lists change, and a trait the C++ side does not declare.
"""

import os
import re

from difftest import REPO_ROOT, load_tool

ROOT = REPO_ROOT
INC = os.path.join(ROOT, "csrc", "ops", "op_table.inc")
HEADER = os.path.join(ROOT, "csrc", "ops", "op_table.h")


def test_table_is_generated_from_the_lists(tmp_path):
    gen = load_tool("gen_op_table")
    gen.OUT = str(tmp_path / "op_table.inc")
    gen.main()
    with open(INC) as f, open(gen.OUT) as g:
        assert f.read() == g.read(), "csrc/ops/op_table.inc is stale: run python tools/gen_op_table.py"


def test_every_value_check_names_a_row():
    # A VALUE_CHECKS name that no longer names a recorded overload (a torch rename) would let
    # that op's failure be dropped unreported when its result is unused (docs/errors.md).
    gen = load_tool("gen_op_table")
    with open(INC) as f:
        bases = {m.split(".")[0] for m in re.findall(r'^\{"([^"]+)"', f.read(), re.M)}
    listed = set().union(*(names for names, _ in gen.VALUE_CHECKS))
    assert listed <= bases, sorted(listed - bases)


def test_every_trait_is_declared_and_listed_traits_reach_a_row():
    gen = load_tool("gen_op_table")
    with open(HEADER) as f:
        declared = set(re.findall(r"^\s*(k[A-Za-z0-9]+) = 1u?l?l? << \d+,", f.read(), re.M))
    with open(INC) as f:
        used = set(re.findall(r"\bk(?!Elementwise|Library|Reduction|Sync|Data|Matmul|Random|View)[A-Z]\w*", f.read()))
    assert used <= declared, used - declared
    listed = {t for t, _, _ in gen.OP_TRAITS + gen.CALL_CHECKS} | {"kCppMetaIsCpu", "kCheckNormalStd", "kChecksValues"}
    assert listed <= declared, listed - declared
    # a list entry that no longer names any recorded overload (a torch rename) drops its correction silently
    assert listed <= used, listed - used


def test_hand_written_kernels_and_the_generators_special_list_agree():
    """tools/gen_op_table.py leaves SPECIAL out of the table because the device registers
    kernels of its own for them; every such kernel is one the registration made, and no
    table row also has a hand-written kernel."""
    import torch_tpu_eager  # noqa: F401  (registers the kernels)
    from torch_tpu_eager import _C

    gen = load_tool("gen_op_table")
    hand = set(_C._hand_written_kernels())
    assert gen.SPECIAL <= hand, sorted(gen.SPECIAL - hand)
    rows = {name for name, _ in _C._op_table()}
    assert len(hand) > len(gen.SPECIAL) and rows.isdisjoint(hand), sorted(rows & hand)
