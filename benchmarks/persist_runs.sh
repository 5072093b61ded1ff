#!/usr/bin/env bash
# Copy a marl.compare directory's finished runs into the repository, small enough to commit,
# so that a study outlives the machine it runs on (sessions end; only git survives).
#
#   bash benchmarks/persist_runs.sh SRC DEST [--policies]
#
# SRC is a `marl.compare --out` directory; DEST (e.g. docs/results/memory_study/memory) gets
# SRC's compare.json and, for every run with a finished.json, its config.yaml, eval.json,
# finished.json and gzipped metrics.jsonl (with --policies also its final policy artifact,
# policy/policy.json and weights.pt, for studies that evaluate the policies afterwards).
# Unfinished runs are left out (they restart).
# Restore with `cp -r DEST SRC && find SRC -name '*.gz' -exec gunzip {} \;`: marl.compare then
# lists the copied runs as finished and skips them.
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; [ "${1:-}" = -h ] || [ "${1:-}" = --help ] && exit 0; exit 2
fi
SRC="${1%/}"; DEST="${2%/}"; POLICIES=0
if [ $# -eq 3 ]; then
    [ "$3" = --policies ] || { echo "persist_runs.sh: unknown option '$3' (allowed: --policies)" >&2; exit 2; }
    POLICIES=1
fi
[ -f "$SRC/compare.json" ] || { echo "persist_runs.sh: $SRC has no compare.json (not a marl.compare --out directory)" >&2; exit 2; }
mkdir -p "$DEST"
cp "$SRC/compare.json" "$DEST/"
n=0
for fin in "$SRC"/runs/*/seed_*/finished.json; do
    [ -f "$fin" ] || continue
    run="$(dirname "$fin")"; rel="${run#"$SRC"/}"
    mkdir -p "$DEST/$rel"
    for f in config.yaml eval.json finished.json; do
        [ -f "$run/$f" ] && cp "$run/$f" "$DEST/$rel/"
    done
    [ -f "$run/metrics.jsonl" ] && gzip -n -c "$run/metrics.jsonl" > "$DEST/$rel/metrics.jsonl.gz"
    if [ "$POLICIES" = 1 ] && [ -f "$run/policy/policy.json" ]; then
        mkdir -p "$DEST/$rel/policy"
        cp "$run/policy/policy.json" "$run/policy/weights.pt" "$DEST/$rel/policy/"
    fi
    n=$((n + 1))
done
echo "persist_runs.sh: $n finished runs of $SRC copied to $DEST"
