#!/usr/bin/env bash
# The memory factorial (issue 36, docs/results/memory_factorial/README.md): backbone {mlp, gru,
# mamba, mamba2} x training settings {t32, t128} on the memory preset, equal env steps, 16
# seeds, run at ONE pinned code commit, resumable across sessions.
#
#   bash benchmarks/memory_factorial.sh [--jobs J] [--seeds K] [--total-steps N] [--dry-run]
#   bash benchmarks/memory_factorial.sh --persist     # finished runs + report into docs/results
#
# The code: the commit in docs/results/memory_factorial/CODE_COMMIT, checked out as a git
# worktree (STUDY_TREE, default $TMPDIR/coopsearch-code-<commit>): every run, whichever
# session trains it, runs that code and records it in finished.json, so later commits on main
# do not mix into the study (marl.compare refuses mixed commits). The runs live in
# runs/memory_factorial (not committed); finished ones are copied into docs/results with
# --persist (benchmarks/persist_runs.sh) and restored from there when runs/ is empty, so a new
# checkout resumes where the last session stopped. Interrupt with Ctrl-C; rerun to resume.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DOCS="$REPO/docs/results/memory_factorial"
OUT="$REPO/runs/memory_factorial"
PY="${PYTHON:-$REPO/.venv/bin/python}"
JOBS=2; SEEDS=16; STEPS=655360; PERSIST=0; EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS="$2"; shift 2 ;;
        --seeds) SEEDS="$2"; shift 2 ;;
        --total-steps) STEPS="$2"; shift 2 ;;
        --persist) PERSIST=1; shift ;;
        --dry-run|--report-only) EXTRA+=("$1"); shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "memory_factorial.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
CODE="$(tr -d '[:space:]' < "$DOCS/CODE_COMMIT")"
TREE="${STUDY_TREE:-${TMPDIR:-/tmp}/coopsearch-code-${CODE:0:12}}"

compare() {
    (cd "$TREE" && PYTHONPATH="$TREE" "$PY" -m marl.compare --study memory_factorial \
        --seeds "$SEEDS" --total-steps "$STEPS" --jobs "$JOBS" --torch-threads 1 \
        --out "$OUT" "$@")
}

if [ ! -d "$TREE" ]; then
    git -C "$REPO" worktree prune
    git -C "$REPO" worktree add --detach "$TREE" "$CODE" >/dev/null
fi
if [ ! -f "$OUT/compare.json" ] && [ -f "$DOCS/compare.json" ]; then
    # a new checkout: start from the runs the last session persisted
    mkdir -p "$OUT"
    cp "$DOCS/compare.json" "$OUT/"
    [ -d "$DOCS/runs" ] && cp -r "$DOCS/runs" "$OUT/"
    find "$OUT/runs" -name 'metrics.jsonl.gz' -exec gunzip -f {} \; 2>/dev/null || true
fi
if [ "$PERSIST" = 1 ]; then
    compare --report-only --no-progress || true  # missing runs are listed, not an error here
    bash "$REPO/benchmarks/persist_runs.sh" "$OUT" "$DOCS"
    cp "$OUT/report.md" "$OUT/summary.json" "$DOCS/"
    rm -rf "$DOCS/plots" && cp -r "$OUT/plots" "$DOCS/"
    exit 0
fi
compare "${EXTRA[@]}"
