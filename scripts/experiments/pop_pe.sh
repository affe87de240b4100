#!/usr/bin/env bash
# Experiment 1 of docs/method.md §6.1 at CPU scale (docs/results.md): identical small REMI models on
# POP909 that differ only in how attention knows about position (the four PE variants of the
# paper, plus the relative-softmax and Aaren attention families). Trained at L = 256, scored
# per position to 4L, and each continues the same prompt for 4L tokens.
#   bash scripts/experiments/pop_pe.sh                       all stages, all models
#   MODELS="ape sine-gated" bash scripts/experiments/pop_pe.sh train
# Stages: train evaluate sample report. Interrupted runs resume where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

L=256
DATA=data/pop909
RUNS=${RUNS:-runs/pop-pe}
OUT=docs/experiments/pop
declare -A MODEL_SETTINGS=(
  [ape]="model.pe=ape"
  [sine-gated]="model.pe=sine model.gated=true"
  [conv-gated]="model.pe=conv model.gated=true"
  [conv-ungated]="model.pe=conv model.gated=false"
  # Other attention families (docs/attention_families.md): exact relative softmax, and Aaren.
  [relative]="model.attention=relative model.pe=none model.max_relative_distance=$L"
  [aaren]="model.attention=aaren model.pe=none"
)
MODELS=${MODELS:-ape sine-gated conv-gated conv-ungated relative aaren}
# Everything but the model settings is shared: data, steps, batch, seed, schedule.
COMMON=(seq_len=$L batch_size=8 steps=800 lr=4e-4 warmup=100 valid_every=0 ckpt_every=100
        workers=0 seed=0)
stages=${*:-train evaluate sample report}

[ -f "$DATA/index.json" ] || "${musegen[@]}" data prepare pop909 --out "$DATA"

for stage in $stages; do
  case $stage in
    train) train_models ;;
    evaluate) evaluate_models validation $((4 * L)) ;;
    sample)
      for m in $MODELS; do
        in_pool "${musegen[@]}" sample --checkpoint "$(latest_checkpoint "$RUNS/$m")" \
          --prompt checkpoints/prompts/pop_progression.mid --length $((4 * L)) --seed 0 --pianoroll \
          --out "$RUNS/$m/samples" --threads 1
      done
      wait ;;
    report)
      args=()
      for m in $MODELS; do
        args+=(--run "$m=$RUNS/$m")
        mkdir -p "$OUT/samples" && cp "$RUNS/$m/samples/pop_progression_000.mid" "$OUT/samples/$m.mid" \
          && cp "$RUNS/$m/samples/pop_progression_000.png" "$OUT/samples/$m.png"
      done
      "${musegen[@]}" evaluate compare "${args[@]}" --train-len $L --out "$OUT" ;;
    *) echo "pop_pe.sh: unknown stage $stage (train evaluate sample report)" >&2; exit 2 ;;
  esac
done
