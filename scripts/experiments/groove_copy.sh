#!/usr/bin/env bash
# What lets a Performer with SPE copy a groove (issue "Groove continuations that keep the prompt's
# style"): short runs at equal compute, each identical to the groove attention comparison
# (scripts/experiments/groove_attention.sh: small preset, L = 512, updates of 8 x 512,
# lr 4e-4, gated sineSPE with K = 8, features redrawn every 40 updates), 600 updates long,
# but for one thing:
#   performer        the baseline, on today's code
#   softmax          exact attention: the upper bound
#   dur-performer    the representation where each note carries its duration (no note-offs)
#   dur-softmax      the same with exact attention
# Each is scored by the copy test (one table with the previous shipped model), by the NLL per
# token type on the test split, and by issue #28's criteria (groove_eval.sh: 60 test pieces x 2).
# Results: docs/experiments/groove-copy/README.md.
#   bash scripts/experiments/groove_copy.sh                 all stages, all models
#   MODELS="softmax" bash scripts/experiments/groove_copy.sh train
# Stages: train evaluate copy continue report. Interrupted runs resume where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

L=512
RUNS=${RUNS:-runs/groove-copy}
OUT=${OUT:-docs/experiments/groove-copy}
declare -A MODEL_SETTINGS=(
  [performer]="model.attention=performer"
  [softmax]="model.attention=softmax"
  [dur-performer]="model.attention=performer"
  [dur-softmax]="model.attention=softmax"
)
declare -A MODEL_DATA=(
  [dur-performer]=data/mma-groove-dur
  [dur-softmax]=data/mma-groove-dur
)
MODELS=${MODELS:-performer softmax dur-performer dur-softmax}
COMMON=(seq_len=$L batch_size=8 steps=600 lr=4e-4 warmup=200 precision=bf16 model.spe_sines=8
        model.redraw=every:40 valid_every=0 ckpt_every=100 keep=1 workers=0 seed=0)
stages=${*:-train evaluate copy continue report}

data_of() { echo "${MODEL_DATA[$1]:-data/mma-groove}"; }

for stage in $stages; do
  case $stage in
    train)
      for m in $MODELS; do
        # shellcheck disable=SC2086
        in_pool train_run "$RUNS/$m" "$(data_of "$m")" "${COMMON[@]}" ${MODEL_SETTINGS[$m]}
      done
      wait ;;
    evaluate)
      for m in $MODELS; do
        in_pool env OMP_NUM_THREADS=1 "${musegen[@]}" evaluate loss --checkpoint "$(latest_checkpoint "$RUNS/$m")" \
          --data "$(data_of "$m")" --split test --max-len $L --out "$RUNS/$m/eval"
      done
      wait ;;
    copy)  # one table: the previous shipped model and every run, on the same patterns
      models=(--checkpoint previous=checkpoints/groove)
      for m in $MODELS; do models+=(--checkpoint "$m=$(latest_checkpoint "$RUNS/$m")"); done
      OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy "${models[@]}" --data data/mma-groove --pieces 12 --samples 2 \
        --seed 0 --threads 1 --out "$RUNS/copy-all" ;;
    continue)  # issue #28's criteria, 60 pieces x 2 samples (scripts/experiments/groove_eval.sh)
      for m in $MODELS; do
        in_pool env PIECES=60 DATA="$(data_of "$m")" bash scripts/experiments/groove_eval.sh \
          "$(latest_checkpoint "$RUNS/$m")" "$RUNS/$m/targets" mma midi
      done
      wait
      for m in $MODELS; do
        ln -sfn ../../copy-all "$RUNS/$m/targets/copy"
        "$py" scripts/experiments/groove_targets.py --mma "$RUNS/$m/targets/mma" --midi "$RUNS/$m/targets/midi" \
          --copy "$RUNS/copy-all" --out "$RUNS/$m/targets"
      done ;;
    report)
      cp "$RUNS/copy-all/copy.md" "$OUT/copy.md"
      for m in $MODELS; do
        mkdir -p "$OUT/$m"
        cp "$RUNS/$m/eval/token_types_test.md" "$RUNS/$m/targets/done_when.md" "$OUT/$m/"
        cp "$RUNS/$m/targets/mma/continuation.md" "$OUT/$m/mma.md"
        cp "$RUNS/$m/targets/midi/continuation.md" "$OUT/$m/midi.md"
        cp "$RUNS/$m/log.jsonl" "$OUT/$m/training_log.jsonl"
      done ;;
    *) echo "groove_copy.sh: unknown stage $stage (train evaluate copy continue report)" >&2; exit 2 ;;
  esac
done
