"""Every command the README and docs/ show runs as written (issue: "as a newcomer runs it").

Collected from README.md and docs/*.md: each fenced ``bash``/``sh``/``python`` block, and
each inline code span that is a command (``python ...``, optionally after ``VAR=value``
assignments). Each runs in a subprocess, from a fresh working directory that sees the
repository's examples/, benchmarks/ and tools/ (and an empty docs/ for reports), with
``TORCH_TPU_QUICK=1`` so long commands run their documented short form, and must exit 0
within its time limit. The benchmarks cap their repeats under ``TORCH_TPU_QUICK=1``.

The README's two set-up commands (install, tests) are not run here (one would
reinstall, the other would run this test): CI runs them, so the test checks that
``.ci/run`` contains each verbatim.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from difftest import REPO_ROOT

ROOT = REPO_ROOT
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:[A-Z][A-Z0-9_]*=\S+ )*python [^`\n]+)`")
TIMEOUT_S = 300


def _setup_commands():
    """The README's two set-up commands: the first two fenced bash blocks."""
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = [body.strip() for lang, body in FENCE.findall(f.read()) if lang == "bash"]
    return blocks[:2]


# Assignments the test's environment makes anyway: a command with or without them is the same run.
IMPLIED = re.compile(r"^(?:(?:PYTHONPATH=\.|TORCH_TPU_QUICK=1) )+", re.M)


def _commands():
    """(id, kind, text) of every runnable command of the docs, in order; a command that
    several places show (up to IMPLIED assignments) runs once, under its first id."""
    setup = set(_setup_commands())
    found, seen = [], set()

    def add(ident, kind, body):
        key = (kind, IMPLIED.sub("", body).strip())
        if key not in seen:
            seen.add(key)
            found.append((ident, kind, body))

    for doc in DOCS:
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for i, (lang, body) in enumerate(FENCE.findall(text)):
            if lang in ("bash", "sh", "python") and body.strip() not in setup:
                add(f"{doc}:block{i}", "python" if lang == "python" else "bash", body)
        for cmd in INLINE.findall(FENCE.sub("", text)):
            add(f"{doc}:`{cmd}`", "bash", cmd)
    return found


COMMANDS = _commands()


def test_commands_were_found():
    assert len(COMMANDS) >= 10, [c[0] for c in COMMANDS]


def test_ci_runs_the_readme_setup_commands_verbatim():
    setup = _setup_commands()
    assert len(setup) == 2
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    for cmd in setup:
        assert cmd in ci, f".ci/run does not run the README's command: {cmd}"


@pytest.mark.parametrize("kind,text", [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_documented_command_runs(kind, text, tmp_path):
    for name in ("examples", "benchmarks", "tools", "csrc", "torch_tpu_eager", "tests"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    (tmp_path / "docs").mkdir()
    env = dict(
        os.environ,
        TORCH_TPU_QUICK="1",
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    )
    argv = [sys.executable, "-c", text] if kind == "python" else ["bash", "-e", "-c", text]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
