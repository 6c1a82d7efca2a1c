#!/bin/sh
# run.sh <built tree> [file ...]: one pytest process per adapted test file in WORK/tests;
# WORK/results/<file>.txt. WORK = $SUITE_WORK, default /work/suites/openreg (run adapt.sh first).
# autoload/ (this directory) registers torch_tpu_eager as a torch.backends entry point.
here=$(cd "$(dirname "$0")" && pwd)
work=${SUITE_WORK:-/work/suites/openreg}
cd "$work" || exit 1
tree=$1; shift
mkdir -p results
files=${*:-$(cd tests && ls test_*.py)}
for f in $files; do
  PYTHONPATH=$tree:$here/autoload timeout 1800 python -m pytest -p no:cacheprovider --timeout 300 -q -rfEs \
    tests/$f > results/$f.txt 2>&1
  echo "$f: $(tail -1 results/$f.txt)"
done
