#!/usr/bin/env bash
# The README's test command: create an isolated virtual environment (.venv), install the
# package with its dev extras (CPU build of torch first, so no multi-GB CUDA build is pulled
# on CPU-only machines), then run the whole test suite.
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
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
