#!/usr/bin/env bash
# Experiment 1 of docs/method.md §6.1 at CPU scale (docs/results.md): identical small REMI models on
# POP909 that differ only in how attention knows about position (the four PE variants of the
# paper, the reference's APE input, plus the relative-softmax and Aaren attention families).
# Trained at L, scored per position to 4L, and each continues the same prompt for 4L tokens.
#   bash scripts/experiments/pop_pe.sh                       all stages, all models (L = 256)
#   MODELS="ape sine-gated" bash scripts/experiments/pop_pe.sh train
#   SCALE=long MODELS="ape sine-gated" bash scripts/experiments/pop_pe.sh train
# SCALE=long: L = 512 and 4,000 updates of 8 x 512 (16.4M tokens, 10x the L = 256 runs), with
# validation to 4L every 500 updates, so each run's log.jsonl holds its within-L and beyond-L
# loss as training goes on (valid_loss, valid_extrapolation).
# Stages: train evaluate sample continue report. Interrupted runs resume where they stopped.
# continue: `evaluate continuation --by-quarter` on the validation songs, continued for about 4L
# tokens (~70 tokens a bar after a ~290-token prompt), each quarter measured against the real bars.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

DATA=data/pop909
if [ "${SCALE:-short}" = long ]; then
  L=512 STEPS=4000 BARS=24 TRACKING=(valid_every=500 valid_len=2048 valid_pieces=44 ckpt_every=250 keep=2)
  RUNS=${RUNS:-runs/pop-pe-long} OUT=docs/experiments/pop-long
else
  L=256 STEPS=800 BARS=12 TRACKING=(valid_every=0 ckpt_every=100)
  RUNS=${RUNS:-runs/pop-pe} OUT=docs/experiments/pop
fi
declare -A MODEL_SETTINGS=(
  [ape]="model.pe=ape"
  [ape-reference]="model.pe=ape model.ape_input=reference"
  [sine-gated]="model.pe=sine model.gated=true"
  # the same sineSPE over each token's onset in beats (16 units a beat, as groove-dur's)
  [sine-gated-beats]="model.pe=sine model.gated=true model.positions=beats model.positions_per_beat=16"
  [conv-gated]="model.pe=conv model.gated=true"
  [conv-ungated]="model.pe=conv model.gated=false"
  # Other attention families (docs/attention_families.md): exact relative softmax, and Aaren.
  [relative]="model.attention=relative model.pe=none model.max_relative_distance=$L"
  [aaren]="model.attention=aaren model.pe=none"
)
MODELS=${MODELS:-ape sine-gated conv-gated conv-ungated relative aaren}
# Everything but the model settings is shared: data, steps, batch, seed, schedule.
COMMON=(seq_len=$L batch_size=8 steps=$STEPS lr=4e-4 warmup=100 "${TRACKING[@]}" workers=0 seed=0)
stages=${*:-train evaluate sample continue report}

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
    continue) continue_models validation --bars "$BARS" --by-quarter --samples-per-piece 2 ;;
    report)
      args=()
      for m in $MODELS; do
        args+=(--run "$m=$RUNS/$m")
        mkdir -p "$OUT/samples" && cp "$RUNS/$m/samples/pop_progression/pop_progression_000.mid" "$OUT/samples/$m.mid" \
          && cp "$RUNS/$m/samples/pop_progression/pop_progression_000.png" "$OUT/samples/$m.png"
      done
      "${musegen[@]}" evaluate compare "${args[@]}" --train-len $L --out "$OUT" ;;
    *) echo "pop_pe.sh: unknown stage $stage (train evaluate sample continue report)" >&2; exit 2 ;;
  esac
done
