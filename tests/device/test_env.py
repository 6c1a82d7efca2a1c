"""The environment knob registry (csrc/device/env.cpp, torch_tpu_eager.env)."""

import glob
import os
import re
import subprocess
import sys

import pytest

from torch_tpu_eager import env

from difftest import REPO_ROOT

ROOT = REPO_ROOT
SOURCES = [
    "setup.py",
    "README.md",
    "csrc/**/*.cpp",
    "csrc/**/*.h",
    "torch_tpu_eager/**/*.py",
    "examples/*.py",
    "benchmarks/*.py",
    "tools/*.py",
    "tests/*.py",
    "docs/*.md",
]


def _import_with(**environ):
    code = "import torch_tpu_eager, torch_tpu_eager.env as e; print(e.get(%r))"
    name = next(iter(environ))
    return subprocess.run(
        [sys.executable, "-c", code % name],
        capture_output=True,
        text=True,
        env=dict(os.environ, **environ),
        timeout=120,
    )


def test_every_knob_named_in_the_repository_is_declared():
    declared = {k.name for k in env.knobs()}
    named = set()
    for pattern in SOURCES:
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            if os.path.abspath(path) == os.path.abspath(__file__):
                continue  # names an undeclared knob on purpose
            with open(path, errors="replace") as f:
                named |= set(re.findall(r"\bTORCH_TPU_[A-Z0-9_]*[A-Z0-9]\b", f.read()))
    assert named - declared == set()
    assert declared - named == set()  # and none is declared that nothing reads or documents


def test_readme_table_is_the_registry():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = re.search(r"<!-- knobs:.*?-->\n(.*?)\n<!-- /knobs -->", readme, re.S)
    assert block and block.group(1) == env.markdown()


def test_report_lists_every_knob_with_its_current_value(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_LOG_REGIONS", "0")
    lines = env.report().splitlines()
    assert len(lines) == 1 + len(env.knobs())
    row = next(line for line in lines if line.startswith("TORCH_TPU_LOG_REGIONS "))
    assert row.split()[1:4] == ["bool", "0", "0"]


@pytest.mark.parametrize(
    "name,value,parsed",
    [
        ("TORCH_TPU_MAX_PENDING_OPS", "17", 17),
        ("TORCH_TPU_MAX_PENDING_BYTES", "3M", 3 << 20),
        ("TORCH_TPU_MAX_PENDING_BYTES", "2G", 2 << 30),
        ("TORCH_TPU_CPU_FALLBACK", "1", True),
        ("TORCH_TPU_DEFER_AND_FUSE", "0", False),
        ("TORCH_TPU_TARGET", "tpu-v6e", "tpu-v6e"),
    ],
)
def test_values_parse(name, value, parsed, monkeypatch):
    monkeypatch.setenv(name, value)
    assert env.get(name) == parsed


@pytest.mark.parametrize("name", ["TORCH_TPU_MAX_PENDING_OPS", "TORCH_TPU_CPU_FALLBACK"])
def test_unset_and_empty_give_the_default(name, monkeypatch):
    default = next(k.default for k in env.knobs() if k.name == name)
    monkeypatch.setenv(name, "")
    assert str(int(env.get(name))) == default


@pytest.mark.parametrize(
    "name,value",
    [
        ("TORCH_TPU_MAX_PENDING_OPS", "12x"),
        ("TORCH_TPU_MAX_PENDING_OPS", "-1"),
        ("TORCH_TPU_MAX_PENDING_BYTES", "99999999999999999999"),
        ("TORCH_TPU_MAX_PENDING_BYTES", "9999999999G"),
        ("TORCH_TPU_CPU_FALLBACK", "yes"),
        ("TORCH_TPU_DEFER_AND_FUSE", "true"),
    ],
)
def test_malformed_value_fails_the_import_naming_the_variable(name, value):
    proc = _import_with(**{name: value})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:") and name in last and repr(value) in last, last


@pytest.mark.parametrize("value", ["0", "17"])
def test_device_count_out_of_range_fails_the_import_naming_only_that_variable(value):
    # Read while the import applies the target: the error names TORCH_TPU_NUM_DEVICES,
    # not TORCH_TPU_TARGET (whose default value is fine).
    proc = _import_with(TORCH_TPU_NUM_DEVICES=value)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:") and "TORCH_TPU_NUM_DEVICES" in last, last
    assert "TORCH_TPU_TARGET" not in last, last


def test_undeclared_name_is_an_error():
    with pytest.raises(RuntimeError, match="not a torch_tpu_eager environment knob"):
        env.get("TORCH_TPU_NO_SUCH_KNOB")


def test_module_prints_the_table():
    proc = subprocess.run([sys.executable, "-m", "torch_tpu_eager.env"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert all(k.name in proc.stdout for k in env.knobs())
