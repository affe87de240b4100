#!/usr/bin/env bash
# What a local exact window (`model.window = W`: exact softmax over the last W tokens, FAVOR+ over
# the older ones, one normalisation) does to the shipped groove model. Results in
# docs/experiments/groove-window/README.md. One CPU thread per job.
#   views     checkpoints/groove-dur's weights read with windows of WINDOWS tokens and with exact
#             softmax over everything, untrained (scripts/experiments/attention_view.py)
#   zero      recall gain and copy test (the sampler's defaults) of the views; and the issue-style
#             continuation protocol with --cache 0 on the Freedoom tunes of tests/data/multitrack
#   data      the MMA corpus in groove-dur tokens, its test styles whole (--limit 640 renders every
#             test style and a few train and validation ones), plus 2,000 random loops
#   finetune  two fine-tuning runs from checkpoints/groove-dur at equal compute, side by side:
#             `plain` (as trained) and `window-256` (the same weights with window 256), 8 x 512
#             tokens an update, lr 1e-4, 20 warm-up updates, cosine over 400; compared at STOP
#   compare   recall gain and the copy test with the model alone (--cache 0, corpus patterns) of
#             the start and both runs at STOP
#   styles    the issue-style continuation protocol on the 60 test-style pieces (2-bar prompts,
#             8 bars, 2 samples, --cache 0) for the start and both runs at STOP
#   bash scripts/experiments/groove_window.sh views zero data finetune compare styles
# Settings (environment): RUNS (runs), WINDOWS ("128 256 512"), STOP (150; the page also has 100).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs}
WINDOWS=${WINDOWS:-128 256 512}
STOP=${STOP:-150}
BASE=checkpoints/groove-dur
DATA=$RUNS/data/mma-groove-dur
OUT=$RUNS/groove-window
stages=${*:-views zero}

views=(trained=$BASE softmax=$OUT/view-softmax)
for w in $WINDOWS; do views+=(window-$w=$OUT/view-window-$w); done

# fine_tune NAME INIT: train (or resume) run NAME from INIT's weights; stop once its checkpoint
# STOP is written and keep that as $OUT/NAME-at-STOP.
fine_tune() {
  local name=$1 init=$2 run=$OUT/ft-$1 kept=$OUT/$1-at-$STOP
  [ -d "$kept" ] && { echo "$kept: done"; return 0; }
  local sets=(--init "$init")
  compgen -G "$run/checkpoints/step-*" >/dev/null && sets+=(--resume)
  for s in seq_len=512 batch_size=8 steps=400 lr=1e-4 warmup=20 model.redraw=every:40 valid_every=0 \
           ckpt_every=50 keep=20 workers=0 seed=1; do sets+=(--set "$s"); done
  mkdir -p "$run"
  OMP_NUM_THREADS=1 "${musegen[@]}" train --data "$DATA" --out "$run" "${sets[@]}" >> "$run/train.out" 2>&1 &
  local pid=$! step=$run/checkpoints/step-$(printf %08d "$STOP")
  until [ -f "$step/model.safetensors" ] || ! kill -0 $pid 2>/dev/null; do sleep 10; done
  sleep 20  # the checkpoint's last files
  kill $pid 2>/dev/null || true
  wait $pid || true
  cp -r "$step" "$kept"
}

for stage in $stages; do
  case $stage in
    views)
      mkdir -p "$OUT"
      [ -d "$OUT/view-softmax" ] || "$py" scripts/experiments/attention_view.py $BASE "$OUT/view-softmax" attention=softmax
      for w in $WINDOWS; do
        [ -d "$OUT/view-window-$w" ] || "$py" scripts/experiments/attention_view.py $BASE "$OUT/view-window-$w" window="$w"
      done ;;
    zero)
      models=()
      for v in "${views[@]}"; do models+=(--checkpoint "$v"); done
      [ -f "$OUT/copy/copy.json" ] || OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy "${models[@]}" \
        --threads 1 --device cpu --out "$OUT/copy"
      for v in "${views[@]}"; do
        in_pool env SAMPLING="--cache 0" bash scripts/experiments/groove_eval.sh "${v#*=}" "$OUT/${v%%=*}" midi table
      done
      wait ;;
    data)
      "${musegen[@]}" data prepare mma-groove --tokenizer groove-dur --limit 640 --loops 2000 --out "$DATA" ;;
    finetune)
      in_pool fine_tune plain $BASE
      in_pool fine_tune window-256 "$OUT/view-window-256"
      wait ;;
    compare)
      [ -f "$OUT/compare/copy.json" ] || OMP_NUM_THREADS=1 "${musegen[@]}" evaluate copy --checkpoint start=$BASE \
        --checkpoint "plain=$OUT/plain-at-$STOP" --checkpoint "window-256=$OUT/window-256-at-$STOP" \
        --data "$DATA" --cache 0 --threads 1 --device cpu --out "$OUT/compare" ;;
    styles)
      for m in start=$BASE "plain=$OUT/plain-at-$STOP" "window-256=$OUT/window-256-at-$STOP"; do
        in_pool env DATA="$DATA" PIECES=60 SAMPLES=2 SAMPLING="--cache 0" \
          bash scripts/experiments/groove_eval.sh "${m#*=}" "$OUT/mma-${m%%=*}" mma table
      done
      wait ;;
    *) echo "groove_window.sh: unknown stage $stage (views zero data finetune compare styles)" >&2; exit 2 ;;
  esac
done
