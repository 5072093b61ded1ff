#!/usr/bin/env bash
# Copy a marl.compare directory's finished runs into the repository, compactly, so that a
# study outlives the machine it runs on (sessions end; only git survives).
#
#   bash benchmarks/persist_runs.sh SRC DEST [--policies[=VARIANTS]]
#
# SRC is a `marl.compare --out` directory; DEST (e.g. docs/results/memory_study/memory) gets
# SRC's compare.json and, for every finished run, its config.yaml, eval.json, finished.json and
# metrics.jsonl.xz: every row of its metrics.jsonl with only the keys the report reads, each
# at the precision the report needs (`python -m marl.experiments.persist SRC DEST`, which
# this runs; its --help says more). With --policies also each run's final policy artifact
# (policy/policy.json and weights.pt), with --policies=a,b only those of variants a and b, for
# studies that evaluate the policies afterwards; without it DEST keeps no policy.
# Unfinished runs are left out (they restart). Rerunning it leaves what it kept byte-identical.
# Restore with `python -m marl.experiments.persist --restore DEST SRC` (benchmarks/study.sh
# does): marl.compare then lists the copied runs as finished and skips them.
# Environment: PYTHON (default .venv/bin/python of this checkout).
set -euo pipefail
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ $# -lt 2 ] || [ $# -gt 3 ]; then usage >&2; exit 2; fi
if [ $# -eq 3 ]; then
    case "$3" in
        --policies|--policies=*) ;;
        *) echo "persist_runs.sh: unknown option '$3' (allowed: --policies, --policies=VARIANTS)" >&2; exit 2 ;;
    esac
fi
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
SRC="$(absolute "$1")"; DEST="$(absolute "$2")"; shift 2
# from the repository, so that this checkout's marl is the one imported
cd "$REPO" && exec "$PY" -m marl.experiments.persist "$SRC" "$DEST" "$@"
