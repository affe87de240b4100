#!/usr/bin/env bash
# Issue #28's "done when" for one groove checkpoint, in one command and one table
# (OUT_DIR/done_when.md and .json): (a) `evaluate continuation` on the unseen MMA test styles
# (pickup bar + 2 bars in, 8 bars out, PIECES x SAMPLES, the sampler's defaults); (b) the same on
# real multi-track MIDI that is not MMA (the Freedoom tunes of tests/data/multitrack), where the
# floor is another tune's bars; (c) `evaluate copy` with its default settings; then
# scripts/experiments/groove_targets.py. Works for any tokenizer that plays track roles (groove, groove-dur...).
#   bash scripts/experiments/groove_eval.sh checkpoints/groove runs/groove-eval
#   DATA=data/mma-groove-dur bash scripts/experiments/groove_eval.sh runs/dur/checkpoints/step-00009000 runs/dur-eval
#   COPY_WITH="softmax=runs/softmax/checkpoints/step-00001500" bash scripts/experiments/groove_eval.sh CKPT OUT copy table
# Settings (environment): DATA (default data/mma-<the checkpoint's tokenizer kind>), PIECES (80),
# SAMPLES (2), MIDI (tests/data/multitrack), MIDI_SAMPLES (4), NAME (the model's name in the copy
# table; default the checkpoint folder's name), COPY_WITH (more NAME=CHECKPOINT for the copy table:
# softmax, the previous model), SAMPLING (more `evaluate continuation` options for (a) and (b), e.g.
# "--cache 0.5 --temperature-by family"), REPORT (a folder, e.g. docs/experiments/groove-targets/<model>: the
# report stage copies the tables there). One CPU thread throughout.
# Stages (after the two arguments): mma midi copy table (all by default) and report (by default
# when REPORT is set). Interrupted continuation
# stages resume where they stopped; a copy stage with a copy.json is done (remove it to redo it).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: groove_eval.sh CHECKPOINT OUT_DIR [STAGE...]  (stages: mma midi copy table report)" >&2; exit 2
fi
for f in config.json tokenizer.json; do
  [ -f "$1/$f" ] || { echo "groove_eval.sh: $1 is not a checkpoint folder (no $f)" >&2; exit 2; }
done
CHECKPOINT=$(realpath "$1")
mkdir -p "$2"
OUT=$(realpath "$2")
shift 2
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh
export OMP_NUM_THREADS=1

kind=$("$py" -c 'import sys; from musegen.schemas import read; from musegen.tokenizers.base import TOKENIZER_FILE; print(read(sys.argv[1], TOKENIZER_FILE).kind)' "$CHECKPOINT/tokenizer.json")
DATA=${DATA:-data/mma-$kind}
PIECES=${PIECES:-80}
SAMPLES=${SAMPLES:-2}
MIDI=${MIDI:-tests/data/multitrack}
MIDI_SAMPLES=${MIDI_SAMPLES:-4}
NAME=${NAME:-$(basename "$CHECKPOINT")}
REPORT=${REPORT:-}
stages=${*:-mma midi copy table${REPORT:+ report}}

# continuation OUT DATA SAMPLES [OPTION...]: the protocol of (a) and (b), seed 0, resumable.
continuation() {
  local out=$1 data=$2 samples=$3; shift 3
  "${musegen[@]}" evaluate continuation --checkpoint "$CHECKPOINT" --data "$data" --prompt-bars 2 --bars 8 \
    --samples-per-piece "$samples" --seed 0 --threads 1 --device cpu ${SAMPLING:-} "$@" --out "$out"
}

for stage in $stages; do
  case $stage in
    mma)
      [ -f "$DATA/index.json" ] || { echo "groove_eval.sh: no prepared corpus at $DATA (set DATA)" >&2; exit 2; }
      continuation "$OUT/mma" "$DATA" "$SAMPLES" --split test --pieces "$PIECES" ;;
    midi) continuation "$OUT/midi" "$MIDI" "$MIDI_SAMPLES" ;;
    copy)
      if [ -f "$OUT/copy/copy.json" ]; then echo "$OUT/copy: done"; continue; fi
      models=(--checkpoint "$NAME=$CHECKPOINT")
      for m in ${COPY_WITH:-}; do models+=(--checkpoint "$m"); done
      [ -f "$DATA/index.json" ] && models+=(--data "$DATA")  # corpus patterns beside the built ones
      "${musegen[@]}" evaluate copy "${models[@]}" --threads 1 --device cpu --out "$OUT/copy" ;;
    table)
      parts=()
      for part in mma midi copy; do [ -d "$OUT/$part" ] && parts+=(--"$part" "$OUT/$part"); done
      "$py" scripts/experiments/groove_targets.py "${parts[@]}" --out "$OUT" ;;
    report)
      [ -n "$REPORT" ] || { echo "groove_eval.sh: the report stage needs REPORT=<folder>" >&2; exit 2; }
      mkdir -p "$REPORT"
      cp "$OUT"/done_when.{md,json} "$REPORT/"
      for part in mma midi; do [ -f "$OUT/$part/continuation.md" ] && cp "$OUT/$part/continuation.md" "$REPORT/$part.md"; done
      [ -f "$OUT/copy/copy.md" ] && cp "$OUT/copy/copy.md" "$REPORT/copy.md" ;;
    *) echo "groove_eval.sh: unknown stage $stage (mma midi copy table report)" >&2; exit 2 ;;
  esac
done
