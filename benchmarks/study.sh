#!/usr/bin/env bash
# Run one published study at its pinned code commit, resumably across sessions (issue 36).
#
#   bash benchmarks/study.sh DIR [--jobs J] [--dry-run] [--report-only]
#   bash benchmarks/study.sh DIR --persist    # finished runs + report into DIR, then commit DIR
#
# DIR is a study's directory under docs/results (e.g. docs/results/whitening_scales/mappo_x10).
# It holds STUDY, one `key=value` per line:
#   code_commit=<40 hex>       the commit every run of the study trains with
#   study=<name>               a built-in study (marl.experiments.studies)
#   seeds=16                   seeds per variant
#   total_steps=1000000        env steps per run (the budget)
#   args=--algo grpo ...       further marl.compare options (optional)
#   persist_policies=1         --persist also keeps each run's final policy (optional; =a,b:
#                              only those of variants a and b)
# The code is checked out as a git worktree ($TMPDIR/coopsearch-code-<commit>), so later
# commits on main do not mix into the study (marl.compare refuses mixed commits). The runs
# live in runs/<DIR below docs/results> (not committed); --persist copies the finished ones
# into DIR in the compact form (benchmarks/persist_runs.sh) and a new checkout restores them
# from there (each compact metrics.jsonl.xz also as a plain metrics.jsonl, which the pinned
# code reads; finished runs are skipped, never resumed), so the next session resumes where
# this one stopped. Interrupt with Ctrl-C; rerun to resume.
# Environment: PYTHON (default .venv/bin/python), STUDY_TREE (the code's checkout), STUDY_RUNS
# (where runs live, default runs/).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
DOCS="$(cd "$1" && pwd)"; shift
[ -f "$DOCS/STUDY" ] || { echo "study.sh: $DOCS has no STUDY file (see --help)" >&2; exit 2; }
JOBS=2; PERSIST=0; EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS="$2"; shift 2 ;;
        --persist) PERSIST=1; shift ;;
        --dry-run|--report-only) EXTRA+=("$1"); shift ;;
        *) echo "study.sh: unknown option '$1' (allowed: --jobs J, --persist, --dry-run, --report-only)" >&2; exit 2 ;;
    esac
done
key() { sed -n "s/^$1=//p" "$DOCS/STUDY" | head -1; }
CODE="$(key code_commit)"; STUDY="$(key study)"; SEEDS="$(key seeds)"; STEPS="$(key total_steps)"
read -r -a ARGS <<< "$(key args)"
for v in code_commit study seeds total_steps; do
    [ -n "$(key $v)" ] || { echo "study.sh: $DOCS/STUDY lacks '$v=' (see --help)" >&2; exit 2; }
done
[[ "$CODE" =~ ^[0-9a-f]{40}$ ]] || { echo "study.sh: code_commit must be 40 hex digits, got '$CODE'" >&2; exit 2; }
for v in SEEDS STEPS; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "study.sh: seeds and total_steps take positive integers, got '${!v}'" >&2; exit 2; }
done
case "$DOCS" in "$REPO"/docs/results/*) REL="${DOCS#"$REPO"/docs/results/}" ;; *) REL="$(basename "$DOCS")" ;; esac
OUT="${STUDY_RUNS:-$REPO/runs}/$REL"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
TREE="${STUDY_TREE:-${TMPDIR:-/tmp}/coopsearch-code-${CODE:0:12}}"

compare() {
    (cd "$TREE" && PYTHONPATH="$TREE" "$PY" -m marl.compare --study "$STUDY" \
        --seeds "$SEEDS" --total-steps "$STEPS" --jobs "$JOBS" --torch-threads 1 \
        "${ARGS[@]}" --out "$OUT" "$@")
}

if [ ! -d "$TREE" ]; then
    git -C "$REPO" worktree prune
    git -C "$REPO" worktree add --detach "$TREE" "$CODE" >/dev/null
fi
if [ ! -f "$OUT/compare.json" ] && [ -f "$DOCS/compare.json" ]; then
    # a new checkout: start from the runs the last session persisted (this checkout's code)
    (cd "$REPO" && "$PY" -m marl.experiments.persist --restore "$DOCS" "$OUT")
fi
if [ "$PERSIST" = 1 ]; then
    compare --report-only --no-progress || true  # missing runs are listed, not an error here
    POLICY_FLAG=()
    case "$(key persist_policies)" in
        "") ;;
        1) POLICY_FLAG=(--policies) ;;
        *) POLICY_FLAG=("--policies=$(key persist_policies)") ;;
    esac
    bash "$REPO/benchmarks/persist_runs.sh" "$OUT" "$DOCS" ${POLICY_FLAG[@]+"${POLICY_FLAG[@]}"}
    for f in report.md summary.json; do [ -f "$OUT/$f" ] && cp "$OUT/$f" "$DOCS/"; done
    if [ -d "$OUT/plots" ]; then rm -rf "$DOCS/plots" && cp -r "$OUT/plots" "$DOCS/"; fi
    # the report as this checkout writes one (the pinned code drew it): plotted-only curves
    # at this checkout's digits, the plots drawn again from summary.json at its size
    (cd "$REPO" && "$PY" -m marl.experiments.persist --reports "$DOCS" --redraw)
    exit 0
fi
compare "${EXTRA[@]}"
