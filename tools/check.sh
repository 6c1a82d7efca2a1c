#!/usr/bin/env bash
# The checks an engineer runs before committing, in order:
#   format      ruff format --check (Python; settings in pyproject.toml)
#   lint        ruff check
#   types       mypy (torch_tpu_eager/; settings in pyproject.toml)
#   cpp-format  clang-format --dry-run --Werror over csrc/ (.clang-format)
#   tests       the fast test tier (tests/README.md); extra arguments go to pytest
# `tools/check.sh` runs all five; `tools/check.sh lint types` only those named.
# Tools (CI pins the same versions in .ci/run): pip install ruff==0.17.6 mypy==2.4.1;
# clang-format 14 (apt install clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

steps=()
pytest_args=()
for a in "$@"; do
  case "$a" in
    format | lint | types | cpp-format | tests) steps+=("$a") ;;
    *) pytest_args+=("$a") ;;
  esac
done
[ ${#steps[@]} -eq 0 ] && steps=(format lint types cpp-format tests)

for step in "${steps[@]}"; do
  echo "== $step"
  case "$step" in
    format) ruff format --check --diff . ;;
    lint) ruff check . ;;
    types) mypy ;;
    cpp-format) git ls-files 'csrc/*.cpp' 'csrc/*.h' | xargs clang-format --dry-run --Werror ;;
    tests) python -m pytest -q -m fast tests "${pytest_args[@]+"${pytest_args[@]}"}" ;;
  esac
done
