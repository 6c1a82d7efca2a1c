#!/usr/bin/env bash
# The checks an engineer runs before committing. The fast test tier (tests/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -m pytest -q -m fast tests "$@"
