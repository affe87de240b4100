#!/usr/bin/env bash
# Experiment 2 of docs/method.md §6.2 at CPU scale (docs/results.md): groove continuation in styles
# never seen in training. Identical small models on the MMA groove corpus that differ only in
# positional encoding (APE, gated sineSPE, gated convSPE), with the settings of the groove
# attention comparison (scripts/experiments/groove_attention.sh: L = 512, updates of
# 8 x 512, K = 8 sines, features redrawn every 40 updates). The paper's protocol: each model
# continues the first 2 bars of every test piece for 1.5L new tokens (about 2L in all), scored per
# quarter with the style metrics against the piece it was prompted with, beside the ceiling (the
# piece's own later bars) and the floor (another style's). Also the NLL per position to 4L on the
# test split, and `evaluate continuation` (notes per bar and durations per role, 8 bars, 80 pieces
# with 2 samples each, as the shipped groove model's card).
#   bash scripts/experiments/groove_pe.sh                 all stages, all models
#   MODELS="ape" bash scripts/experiments/groove_pe.sh train
#   PHASES="1500 3000" RUNS=runs/groove-pe-3000 OUT=docs/experiments/groove/at-3000 \
#     bash scripts/experiments/groove_pe.sh      the record of the first two phases (likewise at-1500)
# Stages: train evaluate sample style continue report. Interrupted runs resume where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

L=512
DATA=data/mma-groove
RUNS=${RUNS:-runs/groove-pe}
OUT=${OUT:-docs/experiments/groove}
declare -A MODEL_SETTINGS=(
  [ape]="model.pe=ape"
  [sine-gated]="model.pe=sine model.gated=true"
  [conv-gated]="model.pe=conv model.gated=true"
)
MODELS=${MODELS:-ape sine-gated conv-gated}
# Everything but the positional encoding is shared; sines and redraw policy as the paper's groove model.
SHARED=(seq_len=$L batch_size=8 lr=4e-4 warmup=200 model.spe_sines=8 model.redraw=every:40
        valid_every=0 ckpt_every=250 keep=1 workers=0 seed=0)
# Three phases: the 1,500 updates of the attention comparison, then resumed to 3,000 and to 4,500,
# each time with the cosine schedule stretched over the new length: the protocol wants
# continuations whose notes end, and after each phase the gated SPE models' bass notes were still
# over 2x the references' median (docs/results.md, experiment B).
read -r -a PHASES <<< "${PHASES:-1500 3000 4500}"
stages=${*:-train evaluate sample style continue report}

[ -f "$DATA/index.json" ] || "${musegen[@]}" data prepare mma-groove --out "$DATA"

for stage in $stages; do
  case $stage in
    train)
      for steps in "${PHASES[@]}"; do
        COMMON=("${SHARED[@]}" "steps=$steps")
        train_models
      done ;;
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
          --baselines --out "$RUNS/$m/style"
      done
      wait ;;
    continue) continue_models test --prompt-bars 2 --bars 8 --samples-per-piece 2 --pieces 80 ;;
    report)
      args=()
      for m in $MODELS; do
        args+=(--run "$m=$RUNS/$m")
        mkdir -p "$OUT/$m" && cp "$RUNS/$m"/continuation/continuation.{md,csv} "$OUT/$m/"
      done
      "${musegen[@]}" evaluate compare "${args[@]}" --train-len $L --out "$OUT" ;;
    *) echo "groove_pe.sh: unknown stage $stage (train evaluate sample style continue report)" >&2; exit 2 ;;
  esac
done
