#!/bin/sh
# adapt.sh: WORK/orig/test_*.py (torch_openreg's test files) -> WORK/tests/test_*.py adapted to the
# "tpu" device, plus this directory's tests/conftest.py. WORK = $SUITE_WORK, default /work/suites/openreg.
here=$(cd "$(dirname "$0")" && pwd)
work=${SUITE_WORK:-/work/suites/openreg}
cd "$work" || exit 1
mkdir -p tests
cp "$here/tests/conftest.py" tests/conftest.py
for f in orig/test_*.py; do
  sed -e 's/torch_openreg/torch_tpu_eager/g' -e 's/openreg/tpu/g' -e 's/OPENREG/TPU/g' \
      -e 's/OpenReg/TPU/g' "$f" > "tests/$(basename "$f")"
done
