#!/usr/bin/env bash
# What limits the groove model (issue "Models worth keeping"): small models on the MMA groove
# corpus, identical to the shipped model's first stage (L = 512, 8 x 512, lr 4e-4, K = 8 sines,
# features redrawn every 40 steps) but 1,500 updates long, that differ in the attention (the
# Performer's FAVOR+ approximation against exact softmax, both with gated sineSPE) or in capacity
# (the Performer with 8 layers instead of 4). Scored per token type within L on the test split
# and on the training pieces (the gap is what the unseen styles cost), and by
# `evaluate continuation` on 24 test pieces.
#   bash scripts/experiments/groove_attention.sh              all stages
#   MODELS=softmax bash scripts/experiments/groove_attention.sh train
# Stages: train evaluate continue report (copies the tables and logs into docs/experiments/).
# Interrupted runs resume where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

L=512
DATA=data/mma-groove
RUNS=${RUNS:-runs/groove-attention}
OUT=docs/experiments/groove-attention
declare -A MODEL_SETTINGS=(
  [performer]="model.attention=performer"
  [softmax]="model.attention=softmax"
  [performer-deep]="model.attention=performer model.n_layers=8"
)
MODELS=${MODELS:-performer softmax performer-deep}
COMMON=(seq_len=$L batch_size=8 steps=1500 lr=4e-4 warmup=200 precision=bf16 model.spe_sines=8
        model.redraw=every:40 valid_every=0 ckpt_every=250 keep=1 workers=0 seed=0)
stages=${*:-train evaluate continue report}

[ -f "$DATA/index.json" ] || "${musegen[@]}" data prepare mma-groove --out "$DATA"

for stage in $stages; do
  case $stage in
    train) train_models ;;
    evaluate) evaluate_models test $L; evaluate_models train $L ;;
    continue) continue_models test --prompt-bars 2 --bars 8 --samples-per-piece 1 --pieces 24 ;;
    report)
      for m in $MODELS; do
        mkdir -p "$OUT/$m"
        cp "$RUNS/$m"/eval/token_types_{test,train}.{md,csv} "$RUNS/$m"/continuation/continuation.{md,csv} "$OUT/$m/"
        cp "$RUNS/$m/log.jsonl" "$OUT/$m/training_log.jsonl"
      done ;;
    *) echo "groove_attention.sh: unknown stage $stage (train evaluate continue report)" >&2; exit 2 ;;
  esac
done
