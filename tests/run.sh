#!/usr/bin/env bash
# The README's test command: create an isolated virtual environment (.venv), install the
# package with its dev extras (CPU build of torch first, so no multi-GB CUDA build is pulled
# on CPU-only machines), then run the test suite without the tests marked `slow`.
#
# Arguments go to pytest. `-m EXPR` replaces the default `-m "not slow"` (`-m slow`: only the
# slow tests; `-m ""`: everything), and so does naming a test file, folder or node id (it runs
# as named, slow or not). .ci/run runs the default suite, then the slow tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # A pinned torch: on these machines it is the local CPU build; elsewhere pip picks the
    # platform's default build of that version.
    .venv/bin/pip install -q "torch==2.13.0"
fi
.venv/bin/pip install -q -e ".[dev]"
if ! .venv/bin/python -c "import marl_eval.utils.data_processing_utils" 2>/dev/null; then
    # marl-eval reads compare's export in tests/test_marl_eval_export.py. Without its
    # dependencies: it pins an old pandas, and the module the test uses needs only numpy and
    # colorama.
    .venv/bin/pip install -q --no-deps "id-marl-eval==0.0.4" colorama
fi

# Two worker processes (pytest-xdist; TEST_WORKERS=N to change, 0 for one process, or give -n
# yourself): the suite's time is mostly one-threaded work (numba compiling each kernel once,
# small training runs), so two cores take about half the wall time of one process.
workers=(-n "${TEST_WORKERS:-2}")
select=(-m "not slow")
for arg in "$@"; do
    case "$arg" in
        -n | -n* | --numprocesses | --numprocesses=*) workers=() ;;  # the caller's workers
        -m | -m* | --markexpr | --markexpr=*) select=() ;;  # the caller's marker expression
        -*) ;;
        *) if [ -e "${arg%%::*}" ]; then select=(); fi ;;  # a test file, folder or node id
    esac
done
# ${a[@]+...}: an empty array under `set -u` (bash < 4.4 calls it unbound)
exec .venv/bin/python -m pytest -q -p no:cacheprovider ${workers[@]+"${workers[@]}"} \
    ${select[@]+"${select[@]}"} "$@"
