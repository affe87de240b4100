#!/usr/bin/env bash
# Does a shuffled drum kit teach the groove Performer to keep the prompt's drums? (issue #28;
# results in docs/experiments/groove-data/README.md). The models drop a third of the prompt's kit
# and play a pattern learnt from the training styles (scripts/experiments/drum_kit.py). With
# `kit_shuffle=0.5`, half the training pieces play their drums on a random permutation of the
# General MIDI kit, so which drum plays what can only be read from the piece itself.
# Two runs continue groove_data.sh's x10 fine-tune (its step 300) side by side, one CPU thread
# each, on the same schedule (700 more updates of 8 x 1,024 tokens on the 10x corpus, lr 5e-5
# after 20 warm-up updates, cosine decay, bf16, seed 2), and differ in kit_shuffle alone:
#   x10-long   kit_shuffle=0
#   x10-kit    kit_shuffle=0.5
# Both are scored as groove_data.sh scores its runs (the 1x corpus's test split), plus the
# real-MIDI part of the protocol, the drum diagnosis (drum_kit.py) and the note NLL by track
# inside and after the prompt (track_nll.py).
#   bash scripts/experiments/groove_kit.sh             # train eval
#   bash scripts/experiments/groove_kit.sh more        # then 300 more shuffled-kit updates (x10-kit-more)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/experiments/common.sh

RUNS=${RUNS:-runs/ft}
SHIPPED=checkpoints/groove-dur
TEST=data/mma-groove-dur
START=$RUNS/x10/checkpoints/step-00000300
COMMON=(seq_len=1024 batch_size=8 steps=700 lr=5e-5 warmup=20 precision=bf16 workers=0 seed=2 log_every=10
        valid_every=0 ckpt_every=100 keep=2)
declare -A KIT_OF=([x10-long]=0 [x10-kit]=0.5)
stages=${*:-train eval}

# score NAME STAGE...: a run's test NLL, groove_eval.sh's STAGEs (60 pieces) and the drum diagnosis, one thread.
score() {
  local name=$1 ckpt; shift
  ckpt=$(latest_checkpoint "$RUNS/$name")
  OMP_NUM_THREADS=1 "${musegen[@]}" evaluate loss --checkpoint "$ckpt" --data "$TEST" --split test --max-len 512 \
    --out "$RUNS/loss-$name"
  DATA=$TEST PIECES=60 bash scripts/experiments/groove_eval.sh "$ckpt" "$RUNS/eval-$name" "$@"
  "$py" scripts/experiments/drum_kit.py "$RUNS/eval-$name/mma" "$TEST" > "$RUNS/eval-$name/drum_kit.md"
}

for stage in $stages; do
  case $stage in
    train)
      [ -d "$START" ] || { echo "groove_kit.sh: no $START (run groove_data.sh first)" >&2; exit 2; }
      for name in x10-long x10-kit; do
        INIT=$START in_pool train_run "$RUNS/$name" data/mma-groove-dur-x10 "${COMMON[@]}" "kit_shuffle=${KIT_OF[$name]}"
      done
      wait ;;
    eval)
      for name in x10-long x10-kit; do in_pool score "$name" mma midi table; done
      wait
      OMP_NUM_THREADS=2 "$py" scripts/experiments/track_nll.py "$TEST" 60 "shipped=$SHIPPED" \
        "x10-long=$(latest_checkpoint "$RUNS/x10-long")" "x10-kit=$(latest_checkpoint "$RUNS/x10-kit")" | tee "$RUNS/track_nll.md"
      OMP_NUM_THREADS=2 "${musegen[@]}" evaluate copy --checkpoint "shipped=$SHIPPED" \
        --checkpoint "x10-long=$(latest_checkpoint "$RUNS/x10-long")" --checkpoint "x10-kit=$(latest_checkpoint "$RUNS/x10-kit")" \
        --data "$TEST" --pieces 12 --threads 2 --device cpu --out "$RUNS/copy-kit" ;;
    more)  # 300 more shuffled-kit updates from x10-kit (lr 3e-5, 10 warm-up updates, seed 3), and their scores
      more=(seq_len=1024 batch_size=8 steps=300 lr=3e-5 warmup=10 precision=bf16 workers=0 seed=3 log_every=10
            valid_every=0 ckpt_every=100 keep=1 kit_shuffle=0.5)
      INIT=$(latest_checkpoint "$RUNS/x10-kit") train_run "$RUNS/x10-kit-more" data/mma-groove-dur-x10 "${more[@]}"
      score x10-kit-more mma table
      OMP_NUM_THREADS=1 "$py" scripts/experiments/track_nll.py "$TEST" 60 \
        "x10-kit-more=$(latest_checkpoint "$RUNS/x10-kit-more")" ;;
    *) echo "groove_kit.sh: unknown stage $stage (train eval more)" >&2; exit 2 ;;
  esac
done
