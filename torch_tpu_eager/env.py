"""The environment knobs of torch_tpu_eager: one registry, printed by ``python -m torch_tpu_eager.env``.

The registry is declared once, in C++ (``csrc/device/env.cpp``), and read here through
the extension, so C++ and Python parse every knob the same way: a bool is exactly
``0`` or ``1``; an int is a decimal integer >= 0 with an optional K/M/G suffix
(powers of 2). ``import torch_tpu_eager`` validates every knob that is set and
raises ``ValueError`` naming the first malformed one.
"""

import os
import sys
from typing import NamedTuple

from . import _C


class Knob(NamedTuple):
    """One environment variable: its name, type (bool/int/string/path), default as it
    would be written in the environment ("" = unset), who reads it (runtime, python,
    build, tests, examples) and what it does."""

    name: str
    type: str
    default: str
    where: str
    doc: str


def knobs():
    """Every knob of the registry, in report order (a list of :class:`Knob`)."""
    return [Knob(*k) for k in _C._env_knobs()]


def get(name):
    """The parsed value of knob ``name`` (bool, int or str; the default when unset).

    Raises ValueError for a malformed value and RuntimeError for a name the
    registry does not declare.
    """
    kind = {k.name: k.type for k in knobs()}.get(name)
    if kind is None:
        raise RuntimeError(f"{name} is not a torch_tpu_eager environment knob")
    return {"bool": _C._env_bool, "int": _C._env_int}.get(kind, _C._env_string)(name)


def validate():
    """Raises ValueError naming the first knob whose value is malformed."""
    _C._env_validate()


def report():
    """The table printed by ``python -m torch_tpu_eager.env``: every knob, its type,
    default, current value (``-`` when unset) and meaning."""
    rows = [("name", "type", "default", "current", "read by", "meaning")]
    for k in knobs():
        rows.append((k.name, k.type, k.default or "-", os.environ.get(k.name) or "-", k.where, k.doc))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows)


def markdown():
    """The registry as the Markdown table README.md carries between its ``knobs``
    markers (tests/device/test_env.py checks that they agree)."""
    lines = ["| variable | type | default | read by | meaning |", "|---|---|---|---|---|"]
    for k in knobs():
        lines.append(
            f"| `{k.name}` | {k.type} | {('`' + k.default + '`') if k.default else 'unset'} | {k.where} | {k.doc} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown() if sys.argv[1:] == ["--markdown"] else report())
    sys.exit(0)
