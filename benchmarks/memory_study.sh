#!/usr/bin/env bash
# Issue 17's memory study, all parts, resumable: rerun the same command after an interruption
# and every part skips its finished runs and resumes the interrupted ones.
#
#   bash benchmarks/memory_study.sh [--out DIR] [--cpu S] [--seeds K] [--jobs J] [--dry-run]
#                                   [--parts memory,family,grouping_mamba,grouping_mamba2,...]
#
# Parts, in this order (each a `python -m marl.compare` directory under --out):
#   memory           mlp / gru / mamba / mamba2 on the memory preset, K seeds, S CPU seconds
#                    each (equal compute). Then score it at equal env steps as well:
#                    `python -m marl.compare --study memory ... --report-only --at-env-steps N`
#                    with N a count every run reached and a multiple of the sequence
#                    backbones' evaluation cadence (eval_every x rollout_steps x num_envs).
#   family           gru vs mamba on three memory-family configurations drawn at random
#                    (Python's random.Random(20261202); no tuning on them), 3 seeds each.
#   grouping_mamba   the default whitening grouped per type / position / chunk with mamba.
#                    Its 'type' arm is the default configuration: the memory part's mamba runs
#                    (same code, seeds, budget and resolved config) are copied in, not rerun.
#   grouping_mamba2  as grouping_mamba with mamba2.
#   grouping_mamba2_paired
#                    type and position with mamba2, both arms run anew and side by side (seed
#                    k of both at once with --jobs 2), so that machine load falls on both
#                    alike: the check of grouping_mamba2, whose copied type arm ran in other
#                    sessions than its new arms.
#
# The variants are spelled out with --variant (not --study), so that a checkout that predates
# the grouping study's current definition runs the same configurations. Keep finished runs in
# the repository as they finish (`bash benchmarks/persist_runs.sh OUT/PART
# docs/results/memory_study/PART`, then commit): a session's machine does not outlive it.
# Publish a part by adding its report.md, summary.json and plots/ (and at_*_env_steps/).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=runs/memory_study
CPU=600
SEEDS=8
JOBS=1
PARTS=memory,family,grouping_mamba,grouping_mamba2,grouping_mamba2_paired
DRY=""
PY="${PYTHON:-.venv/bin/python}"
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --cpu) CPU="$2"; shift 2 ;;
        --seeds) SEEDS="$2"; shift 2 ;;
        --jobs) JOBS="$2"; shift 2 ;;
        --parts) PARTS="$2"; shift 2 ;;
        --dry-run) DRY="--dry-run"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "memory_study.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$CPU" "$SEEDS" "$JOBS"; do
    case "$n" in ''|*[!0-9]*|0) echo "memory_study.sh: --cpu, --seeds, --jobs take positive integers, got '$n'" >&2; exit 2 ;; esac
done
[ -x "$PY" ] || PY=python3

compare() {  # compare OUTDIR ARGS...: one resumable comparison (exit 1 = some runs missing)
    local out="$1"; shift
    echo "== python -m marl.compare $* --out $out"
    "$PY" -m marl.compare "$@" --max-cpu-time "$CPU" --seeds "$SEEDS" --jobs "$JOBS" \
        --torch-threads 1 --no-progress --out "$out" $DRY || [ $? -eq 1 ]
}

grouping() {  # grouping BACKBONE
    local b="$1" out="$OUT/grouping_$1"
    local ti="--whitening=team_individual,--alpha=0.5"
    if [ -z "$DRY" ]; then  # the reference arm is the memory part's default-config runs
        for src in "$OUT"/memory/runs/"$b"/seed_*; do
            [ -f "$src/finished.json" ] || continue
            dst="$out/runs/type/$(basename "$src")"
            [ -e "$dst" ] || { mkdir -p "$(dirname "$dst")"; cp -r "$src" "$dst"; }
        done
    fi
    compare "$out" --common="--backbone=$b,--env.preset=memory" --reference type \
        --variant "type:$ti,--whiten-inner=type" \
        --variant "position:$ti,--whiten-inner=position" \
        --variant "chunk:$ti,--whiten-inner=chunk,--chunk-size=8"
}

for part in ${PARTS//,/ }; do
    case "$part" in
        memory)
            compare "$OUT/memory" --study memory ;;
        grouping_mamba) grouping mamba ;;
        grouping_mamba2) grouping mamba2 ;;
        grouping_mamba2_paired)
            ti="--whitening=team_individual,--alpha=0.5"
            compare "$OUT/grouping_mamba2_paired" --common="--backbone=mamba2,--env.preset=memory" \
                --reference type --variant "type:$ti,--whiten-inner=type" \
                --variant "position:$ti,--whiten-inner=position" ;;
        family)
            i=0
            for env in "18,3,2,6,1200" "24,2,2,4,1400" "23,2,3,6,1200"; do
                IFS=, read -r g s r t c <<< "$env"
                i=$((i + 1))
                SEEDS=3 compare "$OUT/family_$i" --reference gru \
                    --common="--env.preset=memory,--env.grid_size=$g,--env.n_scouts=$s,--env.n_rescuers=$r,--env.n_targets=$t,--env.max_cycles=$c" \
                    --variant "gru:--backbone=gru" --variant "mamba:--backbone=mamba"
            done ;;
        *) echo "memory_study.sh: unknown part '$part' (memory, grouping_mamba, family, grouping_mamba2, grouping_mamba2_paired)" >&2; exit 2 ;;
    esac
done
