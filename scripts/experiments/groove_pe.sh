#!/usr/bin/env bash
# Experiment 2 of docs/method.md §6.2 at CPU scale (docs/results.md): groove continuation in styles
# never seen in training. Identical small models on the MMA groove corpus that differ only in
# positional encoding, trained at L = 256; each continues the first 2 bars of every test piece
# for 1.5L new tokens (about 2L in all with the prompt), scored per quarter with the style
# metrics against the piece it was prompted with. Also the NLL per position to 4L on the test split.
#   bash scripts/experiments/groove_pe.sh                 all stages, all models
#   MODELS="ape" bash scripts/experiments/groove_pe.sh train
# Stages: train evaluate sample style report. Interrupted runs resume where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

L=256
DATA=data/mma-groove
RUNS=${RUNS:-runs/groove-pe}
OUT=docs/experiments/groove
declare -A MODEL_SETTINGS=(
  [ape]="model.pe=ape"
  [sine-gated]="model.pe=sine model.gated=true"
  [conv-gated]="model.pe=conv model.gated=true"
)
MODELS=${MODELS:-ape sine-gated conv-gated}
# Everything but the positional encoding is shared; sines and redraw policy as the paper's groove model.
COMMON=(seq_len=$L batch_size=8 steps=600 lr=4e-4 warmup=100 valid_every=0 ckpt_every=100 workers=0 seed=0
        model.spe_sines=8 model.redraw=every:40)
stages=${*:-train evaluate sample style report}

[ -f "$DATA/index.json" ] || "${musegen[@]}" data prepare mma-groove --out "$DATA"

for stage in $stages; do
  case $stage in
    train) train_models ;;
    evaluate) evaluate_models test $((4 * L)) ;;
    sample)
      for m in $MODELS; do
        in_pool "${musegen[@]}" sample --checkpoint "$(latest_checkpoint "$RUNS/$m")" \
          --prompt "$DATA/references" --prompt-bars 2 --length $((3 * L / 2)) --seed 0 --threads 1 \
          --out "$RUNS/$m/samples"
      done
      wait ;;
    style)
      for m in $MODELS; do
        in_pool "${musegen[@]}" evaluate style --generated "$RUNS/$m/samples" --reference "$DATA/references" \
          --out "$RUNS/$m/style"
      done
      wait ;;
    report)
      args=()
      for m in $MODELS; do args+=(--run "$m=$RUNS/$m"); done
      "${musegen[@]}" evaluate compare "${args[@]}" --train-len $L --out "$OUT" ;;
    *) echo "groove_pe.sh: unknown stage $stage (train evaluate sample style report)" >&2; exit 2 ;;
  esac
done
