#!/usr/bin/env bash
# GPU readiness in one command (issue 17, item 6). On a CUDA machine:
#   1. install the 'cuda' extra (mamba-ssm, causal-conv1d) without build isolation: they
#      compile against the torch already installed (pyproject.toml, README 'GPU');
#   2. run the GPU-only tests (pytest -m gpu: tests/test_seqmodels.py against mamba-ssm,
#      tests/test_whitening.py and tests/test_grpo.py on CUDA tensors);
#   3. time seqmodels.Mamba / Mamba2's cuda backend against the torch path at L >= 1024
#      (forward, forward + backward, speed-up);
#   4. a short mamba MAPPO run's throughput on the GPU against the same run on the CPU.
# The Python part is benchmarks/gpu_bench.py; results go to --out (default runs/gpu).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
    cat <<'EOF'
Usage: bash benchmarks/gpu.sh [options]

GPU readiness: install the 'cuda' extra, run the GPU-only tests, time the cuda backend of
seqmodels.Mamba / Mamba2 against the torch path (L >= 1024), and compare a short mamba MAPPO
run's throughput on the GPU with the CPU. Needs a CUDA device (exit 2 without one).

Options:
  --skip-install   do not pip-install the 'cuda' extra (mamba-ssm, causal-conv1d)
  --python PATH    the interpreter to use (default: .venv/bin/python, else python3)
  --quick          fewer sequence lengths, repetitions and training updates
  --out DIR        where results go (default: runs/gpu)
  --dry-run        print the steps it would run; run nothing (needs no GPU)
  -h, --help       show this help

Exit status: 0 all steps passed; 1 a step failed; 2 bad option or no CUDA device.
Results: DIR/kernels.{json,md}, DIR/train.{json,md}, DIR/pytest_gpu.log.
EOF
}

die_usage() {
    echo "error: $1" >&2
    echo "try: bash benchmarks/gpu.sh --help" >&2
    exit 2
}

SKIP_INSTALL=0
QUICK=0
DRY_RUN=0
OUT="runs/gpu"
PY=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --skip-install) SKIP_INSTALL=1 ;;
        --quick) QUICK=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --python)
            [ $# -ge 2 ] || die_usage "--python needs a PATH"
            PY="$2"; shift ;;
        --python=*) PY="${1#--python=}" ;;
        --out)
            [ $# -ge 2 ] || die_usage "--out needs a DIR"
            OUT="$2"; shift ;;
        --out=*) OUT="${1#--out=}" ;;
        *) die_usage "unknown option '$1'" ;;
    esac
    shift
done
[ -n "$OUT" ] || die_usage "--out must not be empty"

cd "$ROOT"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ "$DRY_RUN" -eq 0 ] && ! command -v "$PY" >/dev/null 2>&1; then
    die_usage "--python '$PY' is not an executable"
fi

QUICK_FLAG=()
if [ "$QUICK" -eq 1 ]; then QUICK_FLAG=(--quick); fi

# a command as one copy-pasteable line
show_command() {
    printf '$'
    printf ' %q' "$@"
    printf '\n'
}

# one step: its title, then the command (printed; run unless --dry-run). A failing step stops
# the script with exit 1 (the CUDA check keeps its own 2).
step() {
    local title="$1"; shift
    echo
    echo "== $title"
    if [ "$1" = gpu_tests ]; then
        show_command "$PY" -m pytest -m gpu -rs -q tests/
    else
        show_command "$@"
    fi
    if [ "$DRY_RUN" -eq 1 ]; then return 0; fi
    local rc=0
    "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "error: step '$title' failed (exit $rc)" >&2
        exit 1
    fi
}

# the GPU tests, their output also in OUT/pytest_gpu.log
gpu_tests() {
    mkdir -p "$OUT"
    "$PY" -m pytest -m gpu -rs -q tests/ 2>&1 | tee "$OUT/pytest_gpu.log"
    return "${PIPESTATUS[0]}"
}

if [ "$DRY_RUN" -eq 1 ]; then
    echo "dry run: the steps gpu.sh would run (python: $PY, out: $OUT); nothing is run"
fi

echo
echo "== 0. CUDA device"
show_command "$PY" benchmarks/gpu_bench.py check
if [ "$DRY_RUN" -eq 0 ]; then
    rc=0
    "$PY" benchmarks/gpu_bench.py check || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "error: gpu.sh needs a CUDA device (see above); --dry-run prints the steps" >&2
        exit 2
    fi
fi
if [ "$SKIP_INSTALL" -eq 0 ]; then
    step "1a. build tools for the 'cuda' extra" \
        "$PY" -m pip install setuptools wheel packaging ninja
    step "1b. install the 'cuda' extra without build isolation (builds against this torch)" \
        "$PY" -m pip install --no-build-isolation -e '.[cuda]'
else
    echo
    echo "== 1. install: skipped (--skip-install)"
fi
step "1c. mamba-ssm importable" "$PY" benchmarks/gpu_bench.py check --require-mamba-ssm
step "2. GPU-only tests (log: $OUT/pytest_gpu.log)" gpu_tests
step "3. cuda backend vs torch path (Mamba, Mamba2; L >= 1024)" \
    "$PY" benchmarks/gpu_bench.py kernels ${QUICK_FLAG[@]+"${QUICK_FLAG[@]}"} --out "$OUT"
step "4. mamba MAPPO throughput, cpu then cuda" \
    "$PY" benchmarks/gpu_bench.py train ${QUICK_FLAG[@]+"${QUICK_FLAG[@]}"} --out "$OUT"
echo
if [ "$DRY_RUN" -eq 1 ]; then
    echo "dry run: nothing was run"
else
    echo "gpu.sh: all steps passed; results in $OUT"
fi
