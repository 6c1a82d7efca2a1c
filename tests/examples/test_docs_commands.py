"""Every command the README and docs/ show runs as written (issue: "as a newcomer runs it").

Collected from README.md and docs/*.md: each fenced ``bash``/``sh``/``python`` block, and
each inline code span that is a command (``python ...``, optionally after ``VAR=value``
assignments). Each runs in a subprocess, from a fresh working directory that sees the
repository's examples/, benchmarks/ and tools/ (and an empty docs/ for reports), with
``TORCH_TPU_QUICK=1`` so long commands run their documented short form, and must exit 0
within its time limit. The benchmarks cap their repeats under ``TORCH_TPU_QUICK=1``.

A command line that does under ``TORCH_TPU_QUICK=1`` exactly what another one does runs
once (``_run_key``): the same script and options up to their order, the environment this
test sets anyway, counts the quick form caps (``--repeats 9`` and ``--repeats 5`` both run
3 repeats), and ``--json PATH``, which only adds a file write after the run (the line with
it is the one kept). The runs test_benchmarks_smoke.py and test_examples.py make in
process (``_runs_made_in_process``) count as made: the quick run_all with one thread and
the quick form of both training examples. Such a line is left out of its block (the rest of
the block still runs as one script); a block left empty is not run.

The README's two set-up commands (install, tests) are not run here (one would
reinstall, the other would run this test): CI runs them, so the test checks that
``.ci/run`` contains each verbatim.
"""

import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

from difftest import DEVICE, QUICK_EXAMPLE_ARGS, REPO_ROOT, RUN_ALL_SMOKE_ARGS

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


# Options whose count TORCH_TPU_QUICK=1 caps, with the cap: a count at or above it runs as
# the option left out does. Each cap is the script's own (see its --help).
QUICK_CAPS = {
    ("benchmarks/run_all.py", "--repeats"): 3,  # QUICK["repeats"], "at most 3"
    ("benchmarks/spyre_interpreter.py", "--repeats"): 2,  # min(args.repeats, 2) when quick
    ("benchmarks/cold_start.py", "--repeats"): 1,  # min(args.repeats, 1) when quick
    ("benchmarks/llama_step.py", "--pairs"): 1,  # 3 pairs when quick, whatever --pairs says
}
# Options that TORCH_TPU_QUICK=1 turns on anyway (their defaults read it).
QUICK_DEFAULTS = {
    "benchmarks/run_all.py": ("--quick", "--no-compile"),
    "examples/train_char_lm.py": ("--quick",),
    "examples/train_digits.py": ("--quick",),
}
# Options that only write the results to a file after the run.
OUTPUT_ONLY = {"benchmarks/run_all.py": ("--json",)}
COMMAND_LINE = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S+ )*python [^#`]+$")


def _run_key(line):
    """(key, writes_output) of a one-line ``python`` command, None for any other line:
    two lines with the same key run the same program under TORCH_TPU_QUICK=1."""
    if not COMMAND_LINE.match(line.strip()):
        return None
    words = shlex.split(IMPLIED.sub("", line.strip()))
    at = words.index("python")
    env, script, args = tuple(sorted(words[:at])), words[at + 1], words[at + 2 :]
    if script.startswith("-") or any(not w.startswith("--") for w in args[:1]):
        return (env, script, tuple(args)), False  # -m / -c / positional arguments: as written
    options, writes, i = [], False, 0
    while i < len(args):
        flag, value = args[i], None
        if not flag.startswith("--"):
            return (env, script, tuple(args)), False
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, i = args[i + 1], i + 1
        i += 1
        cap = QUICK_CAPS.get((script, flag))
        if flag in QUICK_DEFAULTS.get(script, ()) or (cap is not None and int(value) >= cap):
            continue
        if flag in OUTPUT_ONLY.get(script, ()):
            writes = True
        else:
            options.append((flag, value))
    return (env, script, tuple(sorted(options, key=str))), writes


def _runs_made_in_process():
    """Run keys of the documented runs test_benchmarks_smoke.py and test_examples.py make in
    process, when they run (the tpu device; for the digits example also scikit-learn)."""
    if DEVICE != "tpu":
        return set()
    runs = [("benchmarks/run_all.py", RUN_ALL_SMOKE_ARGS), ("examples/train_char_lm.py", QUICK_EXAMPLE_ARGS)]
    if importlib.util.find_spec("sklearn") is not None:
        runs.append(("examples/train_digits.py", QUICK_EXAMPLE_ARGS))
    return {_run_key(" ".join(("python", script, *args)))[0] for script, args in runs}


def _commands():
    """(id, kind, text) of every runnable command of the docs, in order; a command that
    several places show (up to IMPLIED assignments) runs once, under its first id, and a
    line whose run another line makes (``_run_key``) is left out of its block."""
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
    return _drop_repeated_runs(found)


def _drop_repeated_runs(found):
    """``found`` without the bash lines whose run another line (or another test) makes:
    per run key, the first line that writes its output is kept, else the first line."""
    keep = {}  # run key -> (command index, line index, writes_output) of the line kept
    for c, (_, kind, body) in enumerate(found):
        for n, line in enumerate(body.splitlines() if kind == "bash" else ()):
            run = _run_key(line)
            if run is not None and (run[0] not in keep or (run[1] and not keep[run[0]][2])):
                keep[run[0]] = (c, n, run[1])
    for run in _runs_made_in_process():
        keep[run] = None

    def kept(c, n, line):
        run = _run_key(line)
        return run is None or keep[run[0]] == (c, n, run[1])

    result = []
    for c, (ident, kind, body) in enumerate(found):
        if kind == "bash":
            lines = body.splitlines()
            left = [line for n, line in enumerate(lines) if kept(c, n, line)]
            if not any(line.strip() and not line.lstrip().startswith("#") for line in left):
                continue
            if len(left) < len(lines):
                body = "\n".join(left) + "\n"
        result.append((ident, kind, body))
    return result


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


@pytest.mark.parametrize(
    "first,second,same",
    [
        ("python benchmarks/run_all.py --only training --repeats 9", "python benchmarks/run_all.py --only training", 1),
        (
            "python benchmarks/run_all.py --repeats 5 --threads 1",
            "PYTHONPATH=. python benchmarks/run_all.py --threads 1 --repeats 9",
            1,
        ),
        (
            "python benchmarks/spyre_interpreter.py --repeats 15 --cpu-time",
            "python benchmarks/spyre_interpreter.py --cpu-time --repeats 9",
            1,
        ),
        ("python benchmarks/llama_step.py --pairs 100", "python benchmarks/llama_step.py --pairs 40", 1),
        ("python benchmarks/run_all.py --json /tmp/a.json", "python benchmarks/run_all.py", 1),
        (
            "python benchmarks/run_all.py --quick --no-compile --threads 1",
            "python benchmarks/run_all.py --threads 1",
            1,
        ),
        ("python examples/train_char_lm.py", "python examples/train_char_lm.py --quick", 1),
        ("python examples/train_digits.py --quick", "python examples/train_digits.py", 1),
        ("python examples/train_char_lm.py --steps 3", "python examples/train_char_lm.py", 0),
        ("python benchmarks/run_all.py --repeats 2", "python benchmarks/run_all.py", 0),  # below the cap
        ("python benchmarks/run_all.py --threads 1", "python benchmarks/run_all.py", 0),
        (
            "python benchmarks/cold_start.py --repeats 7 --program train",
            "python benchmarks/cold_start.py --program infer",
            0,
        ),
        ("python benchmarks/matmul_epilogue.py --repeats 9", "python benchmarks/matmul_epilogue.py", 0),  # no cap known
        ("python benchmarks/ici_collectives.py --json a.json", "python benchmarks/ici_collectives.py", 0),
        (
            "TORCH_TPU_DEBUG=1 python examples/train_char_lm.py --steps 3",
            "python examples/train_char_lm.py --steps 3",
            0,
        ),
        ("python tests/distributed/dist_worker.py overlap", "python tests/distributed/dist_worker.py", 0),
        ("python -m torch_tpu_eager.env --markdown", "python -m torch_tpu_eager.env", 0),
    ],
)
def test_run_key_tells_equal_runs_from_different_ones(first, second, same):
    assert (_run_key(first)[0] == _run_key(second)[0]) == bool(same), (_run_key(first), _run_key(second))


def test_run_all_quick_cap_is_the_scripts_own():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import run_all

    assert run_all.QUICK["repeats"] == QUICK_CAPS[("benchmarks/run_all.py", "--repeats")]


def test_every_line_left_out_is_run_elsewhere():
    # Every command line of the docs either runs here or has its run key among the runs kept.
    run_here = {
        _run_key(line)[0]
        for _, kind, body in COMMANDS
        if kind == "bash"
        for line in body.splitlines()
        if _run_key(line)
    }
    run_here |= _runs_made_in_process()
    for doc in DOCS:
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        lines = [line for lang, body in FENCE.findall(text) if lang in ("bash", "sh") for line in body.splitlines()]
        for line in lines + INLINE.findall(FENCE.sub("", text)):
            if _run_key(line):
                assert _run_key(line)[0] in run_here, (doc, line)
