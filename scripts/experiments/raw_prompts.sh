#!/usr/bin/env bash
# Does the pop model continue a raw POP909 file (no annotations, its tick grid offset from the
# music) as well as the same song re-timed to its annotated beats? The two-sample AUC of
# `evaluate continuation` on the 44 validation songs: the prepared corpus (re-timed to the
# annotations), and the raw files with --grid file, track and auto. Results in
# docs/experiments/beat-tracker/README.md. One CPU thread a run.
#   bash scripts/experiments/raw_prompts.sh
# Settings (environment): RUNS (runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs}
DATA=$RUNS/data/pop909
RAW=$RUNS/raw-validation
OUT=$RUNS/raw-prompts

[ -f "$DATA/index.json" ] || "${musegen[@]}" data prepare pop909 --out "$DATA"
mkdir -p "$RAW"
SONGS=$("$py" -c 'from data_prep.common import SHARED_DATASETS; print(SHARED_DATASETS)')/pop909
for name in $("$py" -c "import json, sys; print(*json.load(open(sys.argv[1]))['splits']['validation']['names'])" "$DATA/index.json"); do
  cp "$SONGS/$name/$name.mid" "$RAW/"
done
evaluate=(env OMP_NUM_THREADS=1 "${musegen[@]}" evaluate continuation -c checkpoints/pop --threads 1)
"${evaluate[@]}" --data "$DATA" --split validation --out "$OUT/retimed"
for grid in file track auto; do
  "${evaluate[@]}" --data "$RAW" --grid "$grid" --out "$OUT/raw-$grid"
done
for run in retimed raw-file raw-track raw-auto; do
  echo "$run: $(grep '^| generated ' "$OUT/$run/two_sample.md")"
done
